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
)

// The doors beside the gateway on the HTTP listener (docs/design.md,
// "Many front doors, one engine"): tus under /v1/uploads/. Each translates
// its protocol into the store's calls, run on the direct road
// (service/internal/local) as the FileService calls they stand for.

var _ uploads.Calls = (*local.Files)(nil)

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
	ctx, cancel := context.WithCancel(context.Background())
	s.stopDoors = cancel
	go s.uploads.Run(ctx)
	return nil
}

// door is the door that serves path, nil for the gateway's routes.
func (s *Server) door(path string) http.Handler {
	switch {
	case s.uploads != nil && (path == strings.TrimSuffix(uploads.Prefix, "/") || strings.HasPrefix(path, uploads.Prefix)):
		return s.uploads
	}
	return nil
}
