package service

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/store"
)

// The stream's linearizability test: writes go through a WriteStream,
// several in flight, while other clients truncate and read through unary
// calls. The history is checked against a sequential model of the file, as
// the store's linearizability test does (see its comments): four blocks,
// two one-byte probes each (a block's head and middle), every write sets
// whole probes, every read reads one. A write's operation runs from just
// before its message is sent to the arrival of its ack, so a write that
// landed after a Truncate returned although the Truncate was called after
// the write's ack would break the model, and so would a write lost or
// applied twice.
const (
	smBlock  = 4096
	smBlocks = 4
	smProbes = 2 * smBlocks
)

func smProbeOffset(p int) int64 { return int64(p/2)*smBlock + int64(p%2)*smBlock/2 }

type smKind int

const (
	smWriteHead  smKind = iota // 1 byte at a block's head
	smWriteBlock               // a whole block
	smWriteSpan                // a block's middle to the next block's head, inclusive
	smRead                     // one probe
	smTruncate
	smFinal // alone, last: Stat and the file's own bytes
)

type smInput struct {
	kind  smKind
	block int
	probe int
	val   byte
	size  int64
}

type smOutput struct {
	err        error
	n          int   // read: bytes returned
	b          byte  // read: the probe's byte
	size       int64 // write: the ack's size; final: Stat's
	diskSize   int64
	diskProbes [smProbes]byte
}

func (in smInput) writeRange() (int64, int64) {
	base := int64(in.block) * smBlock
	switch in.kind {
	case smWriteHead:
		return base, base + 1
	case smWriteBlock:
		return base, base + smBlock
	}
	return base + smBlock/2, base + smBlock + 1
}

type smState struct {
	size   int64
	probes [smProbes]byte
}

func (s smState) step(in smInput, out smOutput) (bool, smState) {
	if out.err != nil {
		return false, s
	}
	switch in.kind {
	case smWriteHead, smWriteBlock, smWriteSpan:
		off, end := in.writeRange()
		for p := range s.probes {
			if o := smProbeOffset(p); o >= off && o < end {
				s.probes[p] = in.val
			}
		}
		s.size = max(s.size, end)
		// The size an ack reports is read while the write still holds
		// its lock or is in flight: at least its end, maybe more.
		return out.size >= end, s
	case smRead:
		if off := smProbeOffset(in.probe); off >= s.size {
			return out.n == 0, s
		}
		return out.n == 1 && out.b == s.probes[in.probe], s
	case smTruncate:
		s.size = in.size
		for p := range s.probes {
			if smProbeOffset(p) >= s.size {
				s.probes[p] = 0
			}
		}
		return true, s
	case smFinal:
		return out.size == s.size && out.diskSize == s.size && out.diskProbes == s.probes, s
	}
	return false, s
}

func (in smInput) String() string {
	switch in.kind {
	case smWriteHead, smWriteBlock, smWriteSpan:
		off, end := in.writeRange()
		return fmt.Sprintf("stream write [%d, %d) = %d", off, end, in.val)
	case smRead:
		return fmt.Sprintf("read probe @%d", smProbeOffset(in.probe))
	case smTruncate:
		return fmt.Sprintf("truncate %d", in.size)
	}
	return "final"
}

var streamModel = porcupine.Model{
	Init: func() any { return smState{} },
	Step: func(state, input, output any) (bool, any) {
		return state.(smState).step(input.(smInput), output.(smOutput))
	},
	DescribeOperation: func(input, output any) string {
		return fmt.Sprintf("%v -> %+v", input, output)
	},
}

// TestWriteStreamTruncateRace: under every policy, a stream with up to
// four writes in flight, two clients truncating and reading, and the
// history linearizable against the model.
func TestWriteStreamTruncateRace(t *testing.T) {
	for _, policy := range store.Policies() {
		t.Run(policy.String(), func(t *testing.T) {
			// Most writes go through the file's mapping once it is hot,
			// and those the reader can make at once it makes itself
			// (applyInline): the history covers both paths.
			var mapped atomic.Int64
			d := startDaemon(t, func(c *Config) {
				c.Store.Policy = policy
				c.Store.Hooks = &store.Hooks{MappedWrite: func(string) { mapped.Add(1) }}
			})
			defer func() {
				if mapped.Load() == 0 {
					t.Error("no write went through the file's mapping")
				}
			}()
			ctx := testContext(t)
			const path = "model/f"
			stream := openStream(t, ctx, d.client, path)
			var clock atomic.Int64
			var mu sync.Mutex
			var history []porcupine.Operation
			record := func(client int, in smInput, out smOutput, call, ret int64) {
				if out.err != nil {
					t.Errorf("%v: %v", in, out.err)
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
				mu.Unlock()
			}
			const writes, inFlight, otherOps = 500, 4, 250

			// The stream: one sender, one receiver, inFlight writes at most.
			type pending struct {
				in   smInput
				call int64
			}
			var pmu sync.Mutex
			sent := map[uint64]pending{}
			slots := make(chan struct{}, inFlight)
			var wg sync.WaitGroup
			wg.Go(func() {
				for acked := 0; acked < writes; {
					resp, err := stream.Recv()
					if err != nil {
						t.Errorf("stream: %v", err)
						return
					}
					for _, a := range resp.GetAcks() {
						ret := clock.Add(1)
						pmu.Lock()
						p := sent[a.GetId()]
						delete(sent, a.GetId())
						pmu.Unlock()
						out := smOutput{size: a.GetSize()}
						if a.GetStatus() != nil {
							out.err = fmt.Errorf("ack: %v", a.GetStatus())
						}
						record(int(a.GetId()%inFlight), p.in, out, p.call, ret)
						acked++
						<-slots
					}
				}
			})
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(policy), 1))
				for id := range uint64(writes) {
					slots <- struct{}{}
					in := smInput{kind: smKind(rng.IntN(3)), block: rng.IntN(smBlocks), val: byte(id%255 + 1)}
					if in.kind == smWriteSpan {
						in.block = rng.IntN(smBlocks - 1)
					}
					off, end := in.writeRange()
					data := make([]byte, end-off)
					for i := range data {
						data[i] = in.val
					}
					pmu.Lock()
					sent[id] = pending{in, clock.Add(1)}
					pmu.Unlock()
					if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{streamWriteOf(id, off, data, 0)}}); err != nil {
						t.Errorf("send: %v", err)
						return
					}
				}
			})
			for c := range 2 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(policy), uint64(2+c)))
					for range otherOps {
						var in smInput
						var out smOutput
						call := clock.Add(1)
						if rng.IntN(3) == 0 {
							in = smInput{kind: smTruncate, size: []int64{0, smBlock, 2 * smBlock, smProbeOffset(rng.IntN(smProbes)) + 1}[rng.IntN(4)]}
							_, out.err = d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: in.size})
						} else {
							in = smInput{kind: smRead, probe: rng.IntN(smProbes)}
							resp, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: path, Offset: smProbeOffset(in.probe), Length: 1})
							out.err, out.n = err, len(resp.GetData())
							if out.n > 0 {
								out.b = resp.GetData()[0]
							}
						}
						record(1000+c, in, out, call, clock.Add(1))
					}
				})
			}
			wg.Wait()
			stream.CloseSend()
			if e := recvAll(stream); e.err != nil || len(e.acks) != 0 {
				t.Fatalf("stream end: %v, %d more acks", e.err, len(e.acks))
			}
			call := clock.Add(1)
			out := smOutput{}
			st, err := d.client.Stat(ctx, &filewritev1.StatRequest{Path: path})
			out.err, out.size = err, st.GetSize()
			b, err := os.ReadFile(filepath.Join(d.root, path))
			if err != nil {
				t.Fatal(err)
			}
			out.diskSize = int64(len(b))
			for p := range out.diskProbes {
				if o := smProbeOffset(p); o < int64(len(b)) {
					out.diskProbes[p] = b[o]
				}
			}
			record(2000, smInput{kind: smFinal}, out, call, clock.Add(1))
			if t.Failed() {
				return
			}
			res, info := porcupine.CheckOperationsVerbose(streamModel, history, time.Minute)
			switch res {
			case porcupine.Ok:
			case porcupine.Illegal:
				file := filepath.Join(t.TempDir(), "history.html")
				if err := porcupine.VisualizePath(streamModel, info, file); err == nil {
					t.Logf("history: %s", file)
				}
				t.Fatalf("the history of %d operations is not linearizable", len(history))
			default:
				t.Logf("porcupine gave up after a minute on %d operations", len(history))
			}
		})
	}
}
