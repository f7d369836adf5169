package main

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
)

// filesPerStream is how many files one of multiFileStream's streams holds
// declared at most: the daemon's default --max-files-per-stream, which the
// client package keeps as its own default.
const filesPerStream = client.DefaultFilesPerStream

// filesMultiStream is a run of writes at random blocks of random files of
// row over WriteStreams that each carry many files (declared files): at
// most `most` files (-streams) are declared at once over all of them, and
// fewer than the daemon's --max-open-files, with room for the callers'
// files in flight, spread over as few streams as filesPerStream allows;
// a file is declared on first use, in the message that carries its first
// write, and past held declared files the least recently used idle one is
// closed in the same message. Callers' writes queued while a stream's
// sender was busy share its next message.
func filesMultiStream(row filesRow, most int) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		held := min(row.count, most)
		for i, f := range row.flags {
			if f == "--max-open-files" && i+1 < len(row.flags) {
				bound, err := strconv.Atoi(row.flags[i+1])
				if err != nil {
					return nil, err
				}
				held = min(held, max(1, bound-s.clients-64))
			}
		}
		cc, err := grpc.NewClient(dialTarget(s.addr), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		defer cc.Close()
		api := filewritev1.NewFileServiceClient(cc)
		n := (held + filesPerStream - 1) / filesPerStream
		streams := make([]*multiFileStream, n)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		for i := range streams {
			// No routing header: one daemon serves every file here, and a
			// stream's header would have to name its first declared file.
			var md []string
			if s.token != "" {
				md = append(md, "authorization", "Bearer "+s.token)
			}
			st, err := api.WriteStream(metadata.AppendToOutgoingContext(sctx, md...))
			if err != nil {
				return nil, err
			}
			streams[i] = newMultiFileStream(st, (held+n-1)/n, row.path)
			defer streams[i].close()
		}
		data := patternBytes(s.bs)
		sum := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
		seed := uint64(s.round)
		return loop(ctx, s, "WriteStream", func(ctx context.Context, _ int, n int64) error {
			file, off := filesBlock(row, s.bs, seed, n)
			return streams[file%len(streams)].write(ctx, file, off, data, sum)
		}), nil
	}
}

// multiFileStream is one WriteStream of many declared files.
type multiFileStream struct {
	stream grpc.BidiStreamingClient[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]
	held   int
	// path names file number i, when the stream declares it: a writer
	// names its file by number, as a client holding a handle per file
	// would, and the path is made and sent once per declaration.
	path func(i int) string

	// mu guards the fields below.
	mu        sync.Mutex
	byFile    map[int]*declaredFile
	idle      *list.List // of *declaredFile without writes in flight, most recent first
	nextIndex uint32
	nextID    uint64
	waiters   map[uint64]chan error
	next      *filewritev1.WriteStreamRequest // the message being filled
	sending   bool
	err       error // the stream's end
	done      chan struct{}
}

type declaredFile struct {
	file     int
	index    uint32
	inflight int
	elem     *list.Element
}

func newMultiFileStream(st grpc.BidiStreamingClient[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse], held int, path func(int) string) *multiFileStream {
	m := &multiFileStream{stream: st, held: held, path: path, byFile: map[int]*declaredFile{}, idle: list.New(),
		waiters: map[uint64]chan error{}, next: &filewritev1.WriteStreamRequest{}, done: make(chan struct{})}
	go m.receive()
	return m
}

// write sends one write to file number file and waits for its ack.
func (m *multiFileStream) write(ctx context.Context, file int, off int64, data []byte, sum uint32) error {
	ack := make(chan error, 1)
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return m.err
	}
	f := m.byFile[file]
	if f == nil {
		for len(m.byFile) >= m.held && m.idle.Len() > 0 {
			old := m.idle.Remove(m.idle.Back()).(*declaredFile)
			delete(m.byFile, old.file)
			m.next.Close = append(m.next.Close, old.index)
		}
		m.nextIndex++
		f = &declaredFile{file: file, index: m.nextIndex}
		m.byFile[file] = f
		m.next.Files = append(m.next.Files, &filewritev1.StreamFile{Index: f.index, Path: m.path(file)})
	} else if f.elem != nil {
		m.idle.Remove(f.elem)
		f.elem = nil
	}
	f.inflight++
	id := m.nextID
	m.nextID++
	m.waiters[id] = ack
	c := sum
	m.next.Writes = append(m.next.Writes, &filewritev1.StreamWrite{Id: id, File: f.index, Offset: off, Data: data, Crc32C: &c})
	if !m.sending {
		m.sending = true
		go m.send()
	}
	m.mu.Unlock()
	var err error
	select {
	case err = <-ack:
	case <-ctx.Done():
		err = ctx.Err()
	}
	m.mu.Lock()
	if f.inflight--; f.inflight == 0 && m.byFile[file] == f {
		f.elem = m.idle.PushFront(f)
	}
	m.mu.Unlock()
	return err
}

// send sends the messages filled while it runs, one at a time.
func (m *multiFileStream) send() {
	for {
		m.mu.Lock()
		req := m.next
		if len(req.Writes) == 0 && len(req.Files) == 0 && len(req.Close) == 0 {
			m.sending = false
			m.mu.Unlock()
			return
		}
		m.next = &filewritev1.WriteStreamRequest{}
		m.mu.Unlock()
		if err := m.stream.Send(req); err != nil {
			m.mu.Lock()
			m.sending = false
			m.mu.Unlock()
			return // the receiver reports the end
		}
	}
}

// receive hands each ack to its writer until the stream ends.
func (m *multiFileStream) receive() {
	defer close(m.done)
	for {
		resp, err := m.stream.Recv()
		m.mu.Lock()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the daemon ended the stream")
			}
			m.err = fmt.Errorf("multi-file stream: %w", err)
			for id, w := range m.waiters {
				w <- m.err
				delete(m.waiters, id)
			}
			m.mu.Unlock()
			return
		}
		for _, a := range resp.GetAcks() {
			if w := m.waiters[a.GetId()]; w != nil {
				delete(m.waiters, a.GetId())
				if a.GetStatus() != nil {
					w <- status.ErrorProto(a.GetStatus())
				} else {
					w <- nil
				}
			}
		}
		m.mu.Unlock()
	}
}

// close half-closes the stream and waits for its end.
func (m *multiFileStream) close() {
	m.stream.CloseSend()
	<-m.done
}
