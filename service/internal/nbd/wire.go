package nbd

// The protocol's numbers, each under the heading of doc/proto.md (the NBD
// project's protocol document) that defines it. Every value on the wire is
// big-endian ("Conventions").

// Magic numbers ("Newstyle negotiation", "Fixed newstyle negotiation",
// "Request message", "Simple reply message", "Structured reply chunk
// message").
const (
	magicInitPasswd     = 0x4e42444d41474943 // "NBDMAGIC"
	magicIHaveOpt       = 0x49484156454F5054 // "IHAVEOPT"
	magicOptionReply    = 0x3e889045565a9
	magicRequest        = 0x25609513
	magicSimpleReply    = 0x67446698
	magicStructuredRply = 0x668e33ef
)

// Handshake flags, sent by the server ("Handshake flags").
const (
	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1
)

// Client flags ("Client flags"). Any other bit set makes the server drop
// the connection.
const (
	clientFixedNewstyle = 1 << 0
	clientNoZeroes      = 1 << 1
	clientKnownFlags    = clientFixedNewstyle | clientNoZeroes
)

// Transmission flags ("Transmission flags").
const (
	transHasFlags      = 1 << 0
	transReadOnly      = 1 << 1
	transSendFlush     = 1 << 2
	transSendFUA       = 1 << 3
	transSendTrim      = 1 << 5
	transWriteZeroes   = 1 << 6
	transSendDF        = 1 << 7
	transCanMultiConn  = 1 << 8
	transSendCache     = 1 << 10
	transSendFastZero  = 1 << 11
	exportNameReserved = 124 // zero bytes after NBD_OPT_EXPORT_NAME's reply ("Newstyle negotiation")
)

// Option types ("Option types").
const (
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8
	optListMetaContext = 9
	optSetMetaContext  = 10
)

// Option reply types ("Option reply types"); the errors have bit 31 set.
const (
	repAck         = 1
	repServer      = 2
	repInfo        = 3
	repMetaContext = 4

	repErrUnsup   = 1<<31 + 1
	repErrPolicy  = 1<<31 + 2
	repErrInvalid = 1<<31 + 3
	repErrTLSReqd = 1<<31 + 5
	repErrUnknown = 1<<31 + 6
	repErrShutdwn = 1<<31 + 7
	repErrTooBig  = 1<<31 + 9
)

// Information types of NBD_REP_INFO (under "Option reply types").
const (
	infoExport    = 0
	infoName      = 1
	infoBlockSize = 3
)

// Request types ("Request types").
const (
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
	cmdBlockStatus = 7
)

// Command flags ("Command flags").
const (
	cmdFlagFUA      = 1 << 0
	cmdFlagNoHole   = 1 << 1
	cmdFlagDF       = 1 << 2
	cmdFlagReqOne   = 1 << 3
	cmdFlagFastZero = 1 << 4
)

// Structured reply flags and types ("Structured reply flags",
// "Structured reply types").
const (
	replyFlagDone = 1 << 0

	replyTypeNone        = 0
	replyTypeOffsetData  = 1
	replyTypeOffsetHole  = 2
	replyTypeBlockStatus = 5
	replyTypeError       = 1<<15 + 1
)

// Error values ("Error values").
const (
	errnoPERM     = 1
	errnoIO       = 5
	errnoNOMEM    = 12
	errnoINVAL    = 22
	errnoNOSPC    = 28
	errnoOVERFLOW = 75
	errnoNOTSUP   = 95
	errnoSHUTDOWN = 108
)

// base:allocation's status flags ("`base:allocation` metadata context").
const (
	stateHole = 1 << 0
	stateZero = 1 << 1
)

// Sizes on the wire.
const (
	requestHeaderLen = 28 // "Request message"
	optionHeaderLen  = 16 // magic, option, length ("Newstyle negotiation")
	simpleReplyLen   = 16 // "Simple reply message"
	chunkHeaderLen   = 20 // "Structured reply chunk message"
	// maxString is the longest string the protocol allows: export names,
	// error messages, metadata context names ("Conventions").
	maxString = 4096
)

// metaBaseAllocation is the one metadata context served ("The `base:`
// metadata namespace"), and metaBaseAllocationID the id it is given.
const (
	metaBaseAllocation   = "base:allocation"
	metaBaseAllocationID = 1
)
