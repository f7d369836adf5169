// Package gateway serves the FileService as REST: grpc-gateway's JSON routes
// of the proto's google.api.http annotations, with strict JSON and query
// decoding (input.go), the raw-bytes routes (a PUT of an
// application/octet-stream body, appends, reads and alt=media downloads,
// streamed in chunks: stream.go, append.go, media.go) with RFC 9110 ranges
// and validators (conditions.go), and the Allow header of a 405
// (routes.go); which web pages may call it is package origin's. It is a
// gRPC client of the daemon's gateway server, over a pipe inside the
// process, so that a REST call is authenticated, limited and traced as a
// gRPC call is; it takes its bodies' share of the in-flight budget itself
// (admit.Budget). It holds no lock of its own.
package gateway
