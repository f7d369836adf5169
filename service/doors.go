package service

import (
	"context"
	"net/http"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/filewrite/filewrite/internal/shard"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/uploads"
	"github.com/filewrite/filewrite/service/internal/webdav"
)

// The doors beside the gateway on the HTTP listener (docs/design.md,
// "Many front doors, one engine"): tus under /v1/uploads/, WebDAV under
// /dav/. Each translates
// its protocol into the store's calls, run on the direct road
// (service/internal/local) as the FileService calls they stand for.

var (
	_ uploads.Calls = (*local.Files)(nil)
	_ webdav.Files  = (*local.Files)(nil)
)

// doorContext is the context a door's calls run in for r: its metadata is
// what the gateway would send its gRPC server (the Authorization header,
// a verified client certificate's identity, the routing header a proxy
// set), for the token check and the scope, and its peer the host r came
// from.
func doorContext(r *http.Request) context.Context {
	md := auth.GatewayMetadata(r.Context(), r)
	if md == nil {
		md = metadata.MD{}
	}
	for _, v := range r.Header.Values("Authorization") {
		md.Append("authorization", v)
	}
	if v := r.Header.Get(shard.Header); v != "" {
		md.Set(shard.Header, v)
	}
	return local.Incoming(r.Context(), r, md)
}

// startDoors makes the doors of the HTTP listener.
func (s *Server) startDoors() error {
	var err error
	s.uploads, err = uploads.New(uploads.Config{
		Store:           s.store,
		Calls:           s.directRoad(),
		Budget:          s.budget,
		MaxFileSize:     s.cfg.Store.MaxFileSize,
		MaxRequestBytes: s.cfg.Store.MaxRequestBytes,
		BodyTimeout:     s.cfg.BodyTimeout,
		Expiry:          s.cfg.UploadExpiry,
		Owner:           s.auth.Owner,
		Home:            s.auth.Home,
		Context:         doorContext,
		Logger:          s.log,
	})
	if err != nil {
		return err
	}
	s.dav = webdav.New(webdav.Config{
		Store:           s.store,
		Files:           s.directRoad(),
		Budget:          s.budget,
		MaxRequestBytes: s.cfg.Store.MaxRequestBytes,
		Context:         doorContext,
		Logger:          s.log,
	})
	ctx, cancel := context.WithCancel(context.Background())
	s.stopDoors = cancel
	go s.uploads.Run(ctx)
	return nil
}

// door is the door that serves path, nil for the gateway's routes.
func (s *Server) door(path string) http.Handler {
	switch {
	case s.uploads != nil && under(path, uploads.Prefix):
		return s.uploads
	case s.dav != nil && under(path, webdav.Prefix):
		return s.dav
	}
	return nil
}

// under reports whether path is prefix (which ends in a slash), or below.
func under(path, prefix string) bool {
	return path == strings.TrimSuffix(prefix, "/") || strings.HasPrefix(path, prefix)
}

// davCredentials lets WebDAV clients authenticate as they can: a mounted
// share asks for a user name and a password, and sends them as Basic
// credentials. Under /dav/ the password is taken as the bearer token (the
// user name is not looked at), and a 401 asks for Basic credentials
// besides a bearer token, so that a client prompts for them. It runs
// before the token check (auth.Tokens.HTTPMiddleware).
func davCredentials(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !under(r.URL.Path, webdav.Prefix) {
			next.ServeHTTP(w, r)
			return
		}
		if _, pass, ok := r.BasicAuth(); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+pass)
		}
		next.ServeHTTP(&basicChallenge{ResponseWriter: w}, r)
	})
}

// basicChallenge adds a Basic challenge to a 401.
type basicChallenge struct{ http.ResponseWriter }

func (w *basicChallenge) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		w.Header().Add("WWW-Authenticate", `Basic realm="filewrite", charset="UTF-8"`)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *basicChallenge) Unwrap() http.ResponseWriter { return w.ResponseWriter }
