package status

import (
	"fmt"
	"hash/crc32"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
)

// Castagnoli is the CRC-32C table (SSE 4.2 on amd64, the ARMv8 CRC
// instructions on arm64).
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CheckCRC32C refuses data whose CRC-32C is not sent, the checksum that
// came with it in the request field field (CRC_MISMATCH), before the store
// sees it: a refused write or append writes nothing.
func CheckCRC32C(data []byte, sent uint32, field string) error {
	sum := crc32.Checksum(data, Castagnoli)
	if sum == sent {
		return nil
	}
	return Refusal(filewritev1.ErrorReason_CRC_MISMATCH, map[string]string{
		errorinfo.KeyField: field,
		"crc32c_data":      fmt.Sprintf("%#08x", sum),
		"crc32c_sent":      fmt.Sprintf("%#08x", sent),
	}, "the CRC-32C of the data is %#08x, the write says %#08x: nothing written", sum, sent)
}
