package gateway

import (
	"fmt"
	"io"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// rawMarshaler is the gateway's codec for application/octet-stream.
//
// Going out, a ReadResponse is its data, byte for byte. Everything else that
// a raw client can be sent (a WriteResponse from the raw PUT, an error
// status) stays JSON and says so in its Content-Type, so an error is never
// mistaken for file contents.
//
// Coming in, it decodes only into []byte: the raw PUT route reads its body
// itself, and a JSON route sent an octet-stream body gets a clear error
// instead of a misparse.
type rawMarshaler struct {
	json runtime.Marshaler
}

var _ runtime.Marshaler = rawMarshaler{}

func (m rawMarshaler) ContentType(v any) string {
	if _, ok := v.(*filewritev1.ReadResponse); ok {
		return MIMEOctetStream
	}
	return m.json.ContentType(v)
}

func (m rawMarshaler) Marshal(v any) ([]byte, error) {
	if r, ok := v.(*filewritev1.ReadResponse); ok {
		return r.GetData(), nil
	}
	return m.json.Marshal(v)
}

func (m rawMarshaler) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("an %s body is accepted only by PUT /v1/files/{path}; this route takes JSON", MIMEOctetStream)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (m rawMarshaler) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		if _, ok := v.(*[]byte); !ok {
			return m.Unmarshal(nil, v) // the error, without reading the body
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		return m.Unmarshal(data, v)
	})
}

func (m rawMarshaler) NewEncoder(w io.Writer) runtime.Encoder {
	return runtime.EncoderFunc(func(v any) error {
		data, err := m.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	})
}
