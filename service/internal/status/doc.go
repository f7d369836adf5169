// Package status is the daemon's vocabulary of refusals, shared by every
// face (gRPC, REST, and those to come): the one mapping from the store's
// errors to gRPC statuses that carry a google.rpc.ErrorInfo reason (Of,
// and Rules, which docs/errors.md lists for readers), the refusals built
// where a request is refused (Refusal), the translation of the API's enums
// into the store's, the CRC-32C check, the message limits, and the marker
// that a request which did not decode carries. It is the leaf of
// service/internal: it imports no other package of the service, and holds
// no lock.
//
// gRPC's own status package has the same name: a file that needs both
// imports gRPC's as grpcstatus.
package status
