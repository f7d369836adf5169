package streamwire

import (
	"bytes"
	"errors"
	"math"
	"math/bits"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

func ptr[T any](v T) *T { return &v }

// decodeAll is ScanRequest then Each, as the daemon uses them.
func decodeAll(t testing.TB, b []byte, maxWrites int) (Request, []Write, error) {
	r, err := ScanRequest(b, maxWrites)
	if err != nil {
		return r, nil, err
	}
	ws := make([]Write, 0, r.Writes)
	r.Each(func(i int, w *Write) {
		if i != len(ws) {
			t.Fatalf("Each: write %d passed as %d", len(ws), i)
		}
		ws = append(ws, *w)
	})
	if len(ws) != r.Writes {
		t.Fatalf("Each passed %d writes, ScanRequest counted %d", len(ws), r.Writes)
	}
	return r, ws, nil
}

// sameWrites compares decoded writes with the generated code's.
func sameWrites(got []Write, want []*filewritev1.StreamWrite) bool {
	if len(got) != len(want) {
		return false
	}
	for i, w := range got {
		v := want[i]
		if w.ID != v.Id || w.Offset != v.Offset || !bytes.Equal(w.Data, v.Data) || w.Sync != int32(v.Sync) ||
			w.HasCRC != (v.Crc32C != nil) || w.CRC != v.GetCrc32C() || w.Append != v.Append || w.File != v.File ||
			string(w.AppendID) != v.AppendId {
			return false
		}
	}
	return true
}

// wireWrite is v as the encoder takes it.
func wireWrite(v *filewritev1.StreamWrite) *Write {
	return &Write{ID: v.Id, Offset: v.Offset, Data: v.Data, Sync: int32(v.Sync), CRC: v.GetCrc32C(), HasCRC: v.Crc32C != nil,
		Append: v.Append, File: v.File, AppendID: []byte(v.AppendId)}
}

// TestRequestRoundTrip: what the client encodes, the generated code
// decodes to the message it stands for; what the generated code encodes,
// the daemon's decoder reads, unknown fields and known fields of another
// wire type skipped.
func TestRequestRoundTrip(t *testing.T) {
	msg := &filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{
		{Id: 0, Offset: 0, Data: nil, Crc32C: ptr(uint32(0))},
		{Id: 7, Offset: 4096, Data: []byte("hello"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA, Crc32C: ptr(uint32(0xdeadbeef))},
		{Id: math.MaxUint64, Offset: math.MaxInt64, Data: make([]byte, 1000), Sync: 42, Crc32C: ptr(uint32(math.MaxUint32))},
		{Id: 1, Offset: -1, Data: []byte{0}, Sync: filewritev1.SyncMode_SYNC_MODE_FULL, Crc32C: ptr(uint32(1))},
		{Id: 2, Data: []byte("to a declared file"), Crc32C: ptr(uint32(2)), File: 3},
		{Id: 3, Crc32C: ptr(uint32(3)), File: math.MaxUint32},
		{Id: 4, Data: []byte("appended"), Crc32C: ptr(uint32(4)), Append: true, Sync: filewritev1.SyncMode_SYNC_MODE_DATA},
		{Id: 5, Data: []byte("appended once"), Crc32C: ptr(uint32(5)), Append: true, AppendId: "c1-5", File: 2},
		{Id: 6, Append: true, AppendId: "c1-6"},
		{Id: 7, Data: []byte("no CRC")},
	}}

	// Encoder → generated code.
	var enc []byte
	size := 0
	for _, w := range msg.Writes {
		enc = AppendWrite(enc, wireWrite(w))
		size += RequestWriteSize(wireWrite(w))
	}
	if size != len(enc) {
		t.Errorf("RequestWriteSize adds up to %d, AppendWrite wrote %d", size, len(enc))
	}
	got := &filewritev1.WriteStreamRequest{}
	if err := proto.Unmarshal(enc, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, msg) {
		t.Errorf("generated code decodes\n %v\nwant\n %v", got, msg)
	}

	// Generated code → decoder.
	msg.Path = "a/b"
	msg.OpenMode = filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE
	msg.IfGenerationMatch, msg.IfGenerationNotMatch = ptr(int64(0)), ptr(int64(1<<40))
	msg.Writes = append(msg.Writes, &filewritev1.StreamWrite{Id: 9}) // no CRC
	wire, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	extra := protowire.AppendTag(nil, 99, protowire.BytesType)
	extra = protowire.AppendString(extra, "later")
	extra = protowire.AppendTag(extra, FieldRequestPath, protowire.VarintType)
	extra = protowire.AppendVarint(extra, 5)
	extra = protowire.AppendTag(extra, protowire.MaxValidNumber, protowire.BytesType)
	extra = protowire.AppendString(extra, "x")
	for _, b := range [][]byte{wire, append(append([]byte(nil), wire...), extra...)} {
		r, ws, err := decodeAll(t, b, MaxWritesPerMessage)
		if err != nil {
			t.Fatal(err)
		}
		if r.Path != msg.Path || r.OpenMode != int32(msg.OpenMode) || !sameWrites(ws, msg.Writes) ||
			!sameConditions(r.If, msg.IfGenerationMatch, msg.IfGenerationNotMatch) {
			t.Errorf("decoded %q %+v, want %v", r.Path, ws, msg)
		}
		var data int64
		for _, w := range msg.Writes {
			data += int64(len(w.Data))
		}
		if r.DataBytes != data {
			t.Errorf("DataBytes %d, want %d", r.DataBytes, data)
		}
	}
}

// sameConditions compares decoded conditions with the generated code's.
func sameConditions(c Conditions, ifMatch, ifNotMatch *int64) bool {
	same := func(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return same(c.IfMatch, ifMatch) && same(c.IfNotMatch, ifNotMatch)
}

// sameFiles compares decoded declarations and closes with the generated
// code's.
func sameFiles(r Request, want *filewritev1.WriteStreamRequest) bool {
	if len(r.Files) != len(want.Files) || len(r.Closes) != len(want.Close) {
		return false
	}
	for i, f := range r.Files {
		v := want.Files[i]
		if f.Index != v.Index || f.Path != v.Path || f.OpenMode != int32(v.OpenMode) || !sameConditions(f.If, v.IfGenerationMatch, v.IfGenerationNotMatch) {
			return false
		}
	}
	for i, c := range r.Closes {
		if c != want.Close[i] {
			return false
		}
	}
	return true
}

// TestRequestFilesRoundTrip: declarations and closes the client encodes,
// the generated code decodes; those the generated code encodes (closes
// packed), the daemon's decoder reads, with the writes naming their files.
func TestRequestFilesRoundTrip(t *testing.T) {
	msg := &filewritev1.WriteStreamRequest{
		Files: []*filewritev1.StreamFile{
			{Index: 1, Path: "a/one"},
			{Index: math.MaxUint32, Path: "b/two", OpenMode: filewritev1.OpenMode_OPEN_MODE_MUST_EXIST},
			{Index: 0, Path: ""},
			{Index: 2, Path: "c", IfGenerationMatch: ptr(int64(0))},
			{Index: 3, Path: "d", IfGenerationMatch: ptr(int64(1<<62 + 5)), IfGenerationNotMatch: ptr(int64(-1))},
		},
		Close:  []uint32{4, 0, math.MaxUint32},
		Writes: []*filewritev1.StreamWrite{{Id: 5, Data: []byte("x"), Crc32C: ptr(uint32(9)), File: 1}},
	}
	var enc []byte
	size := 0
	for _, f := range msg.Files {
		w := File{Index: f.Index, Path: f.Path, OpenMode: int32(f.OpenMode), If: Conditions{f.IfGenerationMatch, f.IfGenerationNotMatch}}
		enc = AppendFile(enc, &w)
		size += RequestFileSize(&w)
	}
	for _, c := range msg.Close {
		enc = AppendClose(enc, c)
		size += RequestCloseSize(c)
	}
	for _, w := range msg.Writes {
		enc = AppendWrite(enc, wireWrite(w))
		size += RequestWriteSize(wireWrite(w))
	}
	if size != len(enc) {
		t.Errorf("the sizes add up to %d, the encoders wrote %d", size, len(enc))
	}
	got := &filewritev1.WriteStreamRequest{}
	if err := proto.Unmarshal(enc, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, msg) {
		t.Errorf("generated code decodes\n %v\nwant\n %v", got, msg)
	}
	wire, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{enc, wire} {
		r, ws, err := decodeAll(t, b, MaxWritesPerMessage)
		if err != nil {
			t.Fatal(err)
		}
		if !sameFiles(r, msg) || !sameWrites(ws, msg.Writes) {
			t.Errorf("decoded %+v %+v %+v, want %v", r.Files, r.Closes, ws, msg)
		}
	}
	bad := AppendFile(nil, &File{Index: 1, Path: "\xff"})
	if _, err := ScanRequest(bad, MaxWritesPerMessage); !errors.Is(err, ErrPathNotUTF8) {
		t.Errorf("a declared path that is not UTF-8: %v, want ErrPathNotUTF8", err)
	}
	bad = AppendWrite(nil, &Write{Append: true, AppendID: []byte("\xff")})
	if _, err := ScanRequest(bad, MaxWritesPerMessage); !errors.Is(err, ErrAppendIDNotUTF8) {
		t.Errorf("an append_id that is not UTF-8: %v, want ErrAppendIDNotUTF8", err)
	}
	var many []byte
	for i := range MaxFilesPerMessage + 1 {
		many = AppendClose(many, uint32(i))
	}
	var tooMany *TooManyFilesError
	if _, err := ScanRequest(many, MaxWritesPerMessage); !errors.As(err, &tooMany) {
		t.Errorf("%d closes: %v, want TooManyFilesError", MaxFilesPerMessage+1, err)
	}
}

// TestFileStatusRoundTrip: file statuses the daemon encodes, the
// generated code decodes, and the client's decoder reads them back.
func TestFileStatusRoundTrip(t *testing.T) {
	st, _ := proto.Marshal(status.New(codes.NotFound, "gone").Proto())
	in := []FileStatus{{Index: 1, Generation: 1 << 50}, {Index: math.MaxUint32, Status: st}, {}}
	var b []byte
	size := 0
	for i := range in {
		b = AppendFileStatus(b, &in[i])
		size += ResponseFileStatusSize(&in[i])
	}
	b = AppendAck(b, &Ack{ID: 3})
	if size+ResponseAckSize(&Ack{ID: 3}) != len(b) {
		t.Errorf("the sizes add up to %d, the encoders wrote %d", size, len(b))
	}
	got := &filewritev1.WriteStreamResponse{}
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	want := &filewritev1.WriteStreamResponse{
		Acks:  []*filewritev1.StreamAck{{Id: 3}},
		Files: []*filewritev1.StreamFileStatus{{Index: 1, Generation: 1 << 50}, {Index: math.MaxUint32, Status: status.New(codes.NotFound, "gone").Proto()}, {}},
	}
	if !proto.Equal(got, want) {
		t.Errorf("generated code decodes\n %v\nwant\n %v", got, want)
	}
	var decoded []FileStatus
	if err := EachFileStatus(b, func(f *FileStatus) error { decoded = append(decoded, *f); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(decoded) != len(in) {
		t.Fatalf("%d statuses, want %d", len(decoded), len(in))
	}
	for i, f := range decoded {
		if f.Index != in[i].Index || !bytes.Equal(f.Status, in[i].Status) || f.Generation != in[i].Generation {
			t.Errorf("status %d = %+v, want %+v", i, f, in[i])
		}
	}
	if err := EachFileStatus(b[:len(b)-3], func(*FileStatus) error { return nil }); !errors.Is(err, ErrMalformed) {
		t.Errorf("a truncated response: %v, want ErrMalformed", err)
	}
}

// TestScanRequestRefuses: what does not parse, a path that is not UTF-8,
// and one write more than the limit are refused, with errors that name
// no byte of the message.
func TestScanRequestRefuses(t *testing.T) {
	empties := func(n int) []byte {
		var b []byte
		for range n {
			b = protowire.AppendTag(b, FieldRequestWrites, protowire.BytesType)
			b = protowire.AppendVarint(b, 0)
		}
		return b
	}
	good, _ := proto.Marshal(&filewritev1.WriteStreamRequest{Path: "p", Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("secret")}}})
	badPath := protowire.AppendString(protowire.AppendTag(nil, FieldRequestPath, protowire.BytesType), "secret\xff")
	badWrite := protowire.AppendBytes(protowire.AppendTag(nil, FieldRequestWrites, protowire.BytesType), []byte{0x08})
	for _, tt := range []struct {
		name string
		b    []byte
		want error
	}{
		{"truncated", good[:len(good)-2], ErrMalformed},
		{"truncated write", badWrite, ErrMalformed},
		{"path not UTF-8", badPath, ErrPathNotUTF8},
		{"limit", empties(MaxWritesPerMessage), nil},
		{"one past the limit", empties(MaxWritesPerMessage + 1), &TooManyWritesError{}},
	} {
		_, _, err := decodeAll(t, tt.b, MaxWritesPerMessage)
		var tooMany *TooManyWritesError
		switch {
		case tt.want == nil && err != nil:
			t.Errorf("%s: %v, want no error", tt.name, err)
		case errors.As(tt.want, &tooMany):
			if !errors.As(err, &tooMany) || tooMany.Limit != MaxWritesPerMessage {
				t.Errorf("%s: %v, want TooManyWritesError{%d}", tt.name, err, MaxWritesPerMessage)
			}
		case tt.want != nil && !errors.Is(err, tt.want):
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
		if err != nil && bytes.Contains([]byte(err.Error()), []byte("secret")) {
			t.Errorf("%s: the error %q echoes the message", tt.name, err)
		}
	}
}

// TestScanRequestAllocations: ScanRequest allocates nothing per write:
// a message of MaxWritesPerMessage empty writes (8 KiB) and one past the
// limit cost at most the path's string.
func TestScanRequestAllocations(t *testing.T) {
	var full []byte
	full = protowire.AppendString(protowire.AppendTag(full, FieldRequestPath, protowire.BytesType), "a/path")
	for range MaxWritesPerMessage + 1 {
		full = protowire.AppendTag(full, FieldRequestWrites, protowire.BytesType)
		full = protowire.AppendVarint(full, 0)
	}
	for _, tt := range []struct {
		name string
		b    []byte
	}{{"at the limit", full[:len(full)-2]}, {"past the limit", full}} {
		allocs := testing.AllocsPerRun(10, func() {
			r, _ := ScanRequest(tt.b, MaxWritesPerMessage)
			r.Each(func(int, *Write) {})
		})
		if allocs > 2 {
			t.Errorf("%s: %v allocations, want at most 2 (the path; the error)", tt.name, allocs)
		}
	}
}

// TestAckRoundTrip: what the daemon encodes, the generated code decodes;
// what the generated code encodes, the client's decoder reads, in order.
func TestAckRoundTrip(t *testing.T) {
	st, _ := proto.Marshal(status.New(codes.ResourceExhausted, "full").Proto())
	acks := []Ack{{}, {ID: 5, Written: 4096, Size: 1 << 40, Offset: 1 << 39, Generation: 1<<40 | 7}, {ID: math.MaxUint64, Written: 100, Size: 8292, Status: st}}
	var b []byte
	size := 0
	for i := range acks {
		b = AppendAck(b, &acks[i])
		size += ResponseAckSize(&acks[i])
	}
	if size != len(b) {
		t.Errorf("ResponseAckSize adds up to %d, AppendAck wrote %d", size, len(b))
	}
	got := &filewritev1.WriteStreamResponse{}
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	want := &filewritev1.WriteStreamResponse{}
	for _, a := range acks {
		v := &filewritev1.StreamAck{Id: a.ID, BytesWritten: a.Written, Size: a.Size, Offset: a.Offset, Generation: a.Generation}
		if a.Status != nil {
			v.Status = status.New(codes.ResourceExhausted, "full").Proto()
		}
		want.Acks = append(want.Acks, v)
	}
	if !proto.Equal(got, want) {
		t.Errorf("generated code decodes\n %v\nwant\n %v", got, want)
	}

	wire, _ := proto.Marshal(want)
	wire = protowire.AppendString(protowire.AppendTag(wire, 77, protowire.BytesType), "unknown")
	var decoded []Ack
	if err := EachAck(wire, func(a *Ack) error { decoded = append(decoded, *a); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(decoded) != len(acks) {
		t.Fatalf("%d acks, want %d", len(decoded), len(acks))
	}
	for i, a := range decoded {
		if a.ID != acks[i].ID || a.Written != acks[i].Written || a.Size != acks[i].Size || a.Offset != acks[i].Offset || a.Generation != acks[i].Generation || !bytes.Equal(a.Status, acks[i].Status) {
			t.Errorf("ack %d = %+v, want %+v", i, a, acks[i])
		}
	}
	if err := EachAck(wire[:len(wire)-3], func(*Ack) error { return nil }); !errors.Is(err, ErrMalformed) {
		t.Errorf("a truncated response: %v, want ErrMalformed", err)
	}
}

// maxFuzzAllocs bounds what decoding one fuzz input may allocate: the
// path, and the error of a refused message. Nothing per write.
const maxFuzzAllocs = 2

// conditionsSet is how many of c's generation conditions are set.
func conditionsSet(c Conditions) int {
	n := 0
	if c.IfMatch != nil {
		n++
	}
	if c.IfNotMatch != nil {
		n++
	}
	return n
}

// FuzzDecodeStreamRequest: whatever the generated code decodes (within
// the write limit), the daemon's decoder decodes to the same writes; it
// never panics, and allocates nothing per write.
//
//	go test ./internal/streamwire -run '^$' -fuzz FuzzDecodeStreamRequest -fuzztime 1m
func FuzzDecodeStreamRequest(f *testing.F) {
	for _, m := range []*filewritev1.WriteStreamRequest{
		{},
		{Path: "p", Writes: []*filewritev1.StreamWrite{{Id: 1, Offset: 2, Data: []byte("x"), Sync: 1, Crc32C: ptr(uint32(1))}}},
		{Writes: []*filewritev1.StreamWrite{{}, {Id: 3}, {Id: 4, Data: []byte("y"), Append: true}}},
		{Files: []*filewritev1.StreamFile{{Index: 1, Path: "a"}}, Close: []uint32{2, 3}, Writes: []*filewritev1.StreamWrite{{File: 1}, {File: 1, Append: true}}},
		{Writes: []*filewritev1.StreamWrite{{Id: 5, Data: []byte("z"), Append: true, AppendId: "c1-7"}, {Id: 6, AppendId: "no append"}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	// Many empty writes, all id 0: the message that cost the daemon a
	// record per 2 bytes before it was refused.
	var empties []byte
	for range MaxWritesPerMessage + 8 {
		empties = protowire.AppendTag(empties, FieldRequestWrites, protowire.BytesType)
		empties = protowire.AppendVarint(empties, 0)
	}
	f.Add(empties)
	f.Fuzz(func(t *testing.T, b []byte) {
		// Declared files cost a path and the slices' growth each; writes
		// nothing.
		scanned, _ := ScanRequest(b, MaxWritesPerMessage)
		limit := float64(maxFuzzAllocs)
		if n := len(scanned.Files) + len(scanned.Closes); n > 0 {
			limit += float64(2*len(scanned.Files) + 2*bits.Len(uint(n)) + 2)
		}
		// A generation condition costs its int64 once, however often the
		// message repeats the field.
		limit += float64(conditionsSet(scanned.If))
		for _, f := range scanned.Files {
			limit += float64(conditionsSet(f.If))
		}
		if allocs := testing.AllocsPerRun(1, func() { ScanRequest(b, MaxWritesPerMessage) }); allocs > limit {
			t.Fatalf("ScanRequest of %d bytes made %v allocations, want at most %v", len(b), allocs, limit)
		}
		r, ws, err := decodeAll(t, b, MaxWritesPerMessage)
		want := &filewritev1.WriteStreamRequest{}
		if proto.Unmarshal(b, want) != nil {
			return
		}
		if len(want.Files)+len(want.Close) > MaxFilesPerMessage {
			var tooMany *TooManyFilesError
			if !errors.As(err, &tooMany) {
				t.Fatalf("%d files: %v, want TooManyFilesError", len(want.Files)+len(want.Close), err)
			}
			return
		}
		if len(want.Writes) > MaxWritesPerMessage {
			var tooMany *TooManyWritesError
			if !errors.As(err, &tooMany) {
				t.Fatalf("%d writes: %v, want TooManyWritesError", len(want.Writes), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("the generated code decodes %x, the stream's decoder says %v", b, err)
		}
		if r.Path != want.Path || r.OpenMode != int32(want.OpenMode) || !sameWrites(ws, want.Writes) || !sameFiles(r, want) {
			t.Fatalf("decoded %q %+v, want %v", r.Path, ws, want)
		}
	})
}
