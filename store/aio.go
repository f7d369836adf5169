//go:build linux

package store

import (
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// aioRing writes through Linux native AIO (io_submit(2), reaped with
// io_getevents(2) by one goroutine), as fio's libaio engine does, for the
// O_DIRECT|O_DSYNC descriptors of durable writes (durable.go).
//
// Why: a blocking pwrite(2) holds its thread, and with it one of the
// runtime's Ps (GOMAXPROCS of them), for the device's round trip. With 32
// durable writes in flight on two Ps, the Ps sat in pwrite while the
// workers the stream had woken waited to run until the runtime's monitor
// took a P back from a blocked thread (20 us to 10 ms later): in a trace
// of the daemon (`go tool trace -pprof=sched`, `bulk-durable`'s load under
// `--synced-writes direct`), goroutines woken by the stream's reader spent
// on average 15 of every 32 writes' time runnable and not running, and
// the device saw 2-3 writes at once where fio keeps 32. Here a write's
// goroutine parks on a channel, not in the kernel: its P runs the rest at
// once, and the one reaper's thread waits for every write.
//
// A write through the ring is the same write as a pwrite(2) on its
// descriptor: the kernel completes an O_DSYNC one (iomap's
// IOMAP_DIO_NEED_SYNC) only once the bytes and what is needed to read
// them are durable, so the File's contract does not move. Where the
// ring cannot take a write (no AIO in the kernel or the sandbox, the
// ring full), the write is a pwrite(2) as before.
type aioRing struct {
	// ctx is the kernel's aio_context_t; immutable.
	ctx uintptr

	// mu guards the fields below. A leaf lock: no syscall under it.
	mu sync.Mutex
	// reqs holds the writes submitted and not yet reaped, by the slot
	// their iocb carries in aio_data; free lists the empty slots.
	reqs []*aioReq
	free []uint64
	// inflight counts the writes being submitted or in the kernel;
	// reaping: a reaper runs. A reaper exits once inflight is 0, so that
	// an idle ring keeps no goroutine.
	inflight int
	reaping  bool
	closed   bool
}

// aioDepth is the ring's size: the writes the kernel holds for it at
// once. A write past it (EAGAIN) is a pwrite(2).
const aioDepth = 256

// aioIdle is how long a reaper waits for events before it looks whether
// anything is still in flight: a write whose submission failed was
// counted in flight, and its reaper must not wait forever for it.
const aioIdle = 100 * time.Millisecond

// iocb is the kernel's struct iocb (include/uapi/linux/aio_abi.h), for
// little-endian 64-bit machines.
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// ioEvent is the kernel's struct io_event.
type ioEvent struct {
	data uint64
	obj  uint64
	res  int64
	res2 int64
}

// iocbCmdPwrite is IOCB_CMD_PWRITE.
const iocbCmdPwrite = 1

// aioReq is one write in the ring; done gets its result (bytes written,
// or -errno).
type aioReq struct {
	cb   iocb
	done chan int64
}

var aioReqPool = sync.Pool{New: func() any { return &aioReq{done: make(chan int64, 1)} }}

// newAIORing sets up a ring, nil if the kernel refuses (no AIO, the
// system's aio-max-nr reached, a sandbox).
func newAIORing() *aioRing {
	if unsafe.Sizeof(iocb{}) != 64 || unsafe.Sizeof(ioEvent{}) != 32 || !littleEndian() {
		return nil
	}
	var ctx uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, aioDepth, uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return nil
	}
	return &aioRing{ctx: ctx}
}

func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// pwrite is pwrite(2) of p at off on fd through the ring: it returns once
// the kernel completed the write. It has pwrite(2)'s signature, errors
// included, for osFile.whole.
func (r *aioRing) pwrite(fd int, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return unix.Pwrite(fd, p, off)
	}
	q := aioReqPool.Get().(*aioReq)
	q.cb = iocb{opcode: iocbCmdPwrite, fildes: uint32(fd), buf: uint64(uintptr(unsafe.Pointer(&p[0]))), nbytes: uint64(len(p)), offset: off}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		aioReqPool.Put(q)
		return unix.Pwrite(fd, p, off)
	}
	if n := len(r.free); n > 0 {
		q.cb.data = r.free[n-1]
		r.free = r.free[:n-1]
		r.reqs[q.cb.data] = q
	} else {
		q.cb.data = uint64(len(r.reqs))
		r.reqs = append(r.reqs, q)
	}
	r.inflight++
	if !r.reaping {
		r.reaping = true
		go r.reap()
	}
	r.mu.Unlock()
	cbp := &q.cb
	n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, r.ctx, 1, uintptr(unsafe.Pointer(&cbp)))
	if e != 0 || n != 1 {
		// Not submitted (EAGAIN: the ring is full): nothing of it
		// reached the kernel.
		r.mu.Lock()
		r.reqs[q.cb.data] = nil
		r.free = append(r.free, q.cb.data)
		r.inflight--
		r.mu.Unlock()
		aioReqPool.Put(q)
		return unix.Pwrite(fd, p, off)
	}
	res := <-q.done
	// The kernel is done with p; the address in the iocb hid it from the
	// collector until here.
	runtime.KeepAlive(p)
	aioReqPool.Put(q)
	if res < 0 {
		return 0, unix.Errno(-res)
	}
	return int(res), nil
}

// reap hands each completed write its result, until none is in flight.
func (r *aioRing) reap() {
	var evs [64]ioEvent
	timeout := unix.NsecToTimespec(int64(aioIdle))
	for {
		n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, r.ctx, 1, uintptr(len(evs)),
			uintptr(unsafe.Pointer(&evs[0])), uintptr(unsafe.Pointer(&timeout)), 0)
		if e == unix.EINTR {
			continue
		}
		r.mu.Lock()
		if e != 0 {
			// The ring is gone (close): what it held will not complete.
			for i, q := range r.reqs {
				if q != nil {
					q.done <- -int64(e)
					r.reqs[i] = nil
					r.free = append(r.free, uint64(i))
					r.inflight--
				}
			}
		}
		for _, ev := range evs[:n] {
			q := r.reqs[ev.data]
			r.reqs[ev.data] = nil
			r.free = append(r.free, ev.data)
			r.inflight--
			q.done <- ev.res
		}
		if r.inflight == 0 {
			r.reaping = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// close gives the ring back to the kernel. Preconditions: no write is in
// flight (every file using it is closed).
func (r *aioRing) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	unix.Syscall(unix.SYS_IO_DESTROY, r.ctx, 0, 0)
}
