package status

import (
	"log/slog"

	"google.golang.org/grpc/codes"
)

// FailureLevel is slog.LevelError for the codes that mean the server or
// the disk failed, so that an operator sees I/O errors without debug logs,
// and slog.LevelDebug for the rest.
func FailureLevel(code codes.Code) slog.Level {
	switch code {
	case codes.Internal, codes.DataLoss, codes.Unknown:
		return slog.LevelError
	}
	return slog.LevelDebug
}
