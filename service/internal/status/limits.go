package status

// HealthPrefix is the gRPC health service's method prefix: its calls need
// no token, and never wait for the in-flight budget, so that
// a probe answers while either would hold other calls back.
const HealthPrefix = "/grpc.health.v1.Health/"

// MessageOverhead is what a message carries besides its data: a path of up
// to store.MaxPathLen bytes, a few varints and the protobuf tags. Adding it
// to --max-request-bytes lets a Write of exactly that many bytes through the
// transport, so the store, not the transport, decides at the limit, with a
// message that names it.
const MessageOverhead = 64 << 10

// MaxMessageBytes is the message limit, both ways, for a data limit: what
// a unary call may carry, and a WriteStream message.
func MaxMessageBytes(maxRequestBytes int64) int {
	return int(maxRequestBytes) + MessageOverhead
}
