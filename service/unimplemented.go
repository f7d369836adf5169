package service

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// The RPCs below are in the proto, and so in api/, before their handlers:
// each answers UNIMPLEMENTED, as the generated UnimplementedFileServiceServer
// would, until its issue lands. Whoever writes a handler deletes its stub
// here, and this file once it is empty (with its mention in status.go). They are spelled out, rather than
// inherited, so that fileServer embeds UnsafeFileServiceServer and the next
// RPC added to the proto without a handler does not compile.

// Delete lands with issue 15 (Delete, Rename, List).
func (s *fileServer) Delete(context.Context, *filewritev1.DeleteRequest) (*filewritev1.DeleteResponse, error) {
	return nil, notImplemented("Delete")
}

// Rename lands with issue 15 (Delete, Rename, List).
func (s *fileServer) Rename(context.Context, *filewritev1.RenameRequest) (*filewritev1.RenameResponse, error) {
	return nil, notImplemented("Rename")
}

// List lands with issue 15 (Delete, Rename, List).
func (s *fileServer) List(context.Context, *filewritev1.ListRequest) (*filewritev1.ListResponse, error) {
	return nil, notImplemented("List")
}

// notImplemented answers as the generated stubs do, word for word.
func notImplemented(method string) error {
	return status.Error(codes.Unimplemented, "method "+method+" not implemented")
}
