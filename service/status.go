package service

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/store"
)

// toStatus is the one place where the store's errors, and the handlers'
// own, become gRPC statuses (and, through the gateway, HTTP statuses). store
// wraps its sentinels with %w, so they are matched with errors.Is; the
// message keeps the whole chain, which names the path and the limit that was
// hit.
//
// Statuses that involve no store error are built where the request is
// refused: UNAUTHENTICATED in auth.go; the gateway's refusals of a path,
// query or body (gateway.go, gatewayinput.go, gatewaystream.go); a
// malformed message (codec.go); an Extents page_size or page_token
// (paging.go); and a WriteStream's own refusals and endings
// (writestream.go).
//
// The order matters where one error can match two cases: a failed sync is
// reported as DATA_LOSS even when ENOSPC caused it, because the caller's
// earlier unsynced writes may be gone, which "no space" alone would hide.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		// Already a status (from the transport or a client call): keep it.
		return st.Err()
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, store.ErrInvalidPath),
		errors.Is(err, store.ErrPathTooLong),
		errors.Is(err, store.ErrPathEscapes),
		errors.Is(err, store.ErrIsDirectory),
		errors.Is(err, store.ErrNotRegular),
		errors.Is(err, store.ErrInvalidOffset),
		errors.Is(err, store.ErrInvalidMode),
		errors.Is(err, store.ErrInvalidPage):
		code = codes.InvalidArgument
	case errors.Is(err, store.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, store.ErrExists):
		code = codes.AlreadyExists
	case errors.Is(err, store.ErrSyncFailed), errors.Is(err, store.ErrFileRemoved):
		code = codes.DataLoss
	case errors.Is(err, store.ErrFileTooLarge),
		errors.Is(err, store.ErrRequestTooLarge),
		errors.Is(err, store.ErrNoSpace),
		errors.Is(err, store.ErrTooManyOpenFiles),
		errors.Is(err, store.ErrNoDescriptors),
		errors.Is(err, store.ErrTooManyWaiters):
		// Out of descriptors too: the daemon is up and serves the files it
		// has open, and the request changed nothing; UNAVAILABLE would
		// say the daemon is down, and send clients elsewhere or into
		// retries that open more connections, each a descriptor.
		code = codes.ResourceExhausted
	case errors.Is(err, store.ErrUnsupported):
		code = codes.FailedPrecondition
	case errors.Is(err, store.ErrClosed):
		code = codes.Unavailable
	}
	return status.Error(code, err.Error())
}
