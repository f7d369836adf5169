// Package origin decides which web pages may call the daemon, on the one
// origin list of --http-allowed-origins: the guard that refuses what a
// browser sends on a page's behalf (cross-site requests, DNS rebinding;
// browser.go) and CORS for the listed origins on the REST, tus and WebDAV
// routes (cors.go). It holds no state beyond its lists, fixed at start.
package origin
