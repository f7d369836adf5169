//go:build linux

package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDeleteAndRenameWaitForWrites: under every policy, writes held inside
// the store (in flight, or holding the lock shared or exclusively) keep a
// Delete or Rename from finishing; once they finish, it does, and their
// bytes are in the renamed file (or gone with the deleted one).
func TestDeleteAndRenameWaitForWrites(t *testing.T) {
	const bs = 4096
	ops := map[string]func(ctx context.Context, s *Store) error{
		"delete": func(ctx context.Context, s *Store) error { return s.Delete(ctx, "f", false) },
		"rename": func(ctx context.Context, s *Store) error { return s.Rename(ctx, "f", "g", false, false) },
	}
	for _, opName := range []string{"delete", "rename"} {
		for _, p := range Policies() {
			t.Run(opName+"/"+p.String(), func(t *testing.T) {
				ctx := context.Background()
				s, dir := newTestStore(t, Options{Policy: p})
				if _, err := s.Write(ctx, "f", 0, make([]byte, 8*bs), SyncNone); err != nil {
					t.Fatal(err)
				}
				// Overwrites of written blocks: in flight, shared or
				// exclusive as the policy says, all inside at once except
				// under exclusive.
				writers := 4
				if p == PolicyExclusive {
					writers = 1
				}
				g, wg := holdWriters(t, s, writers, func(i int) (int64, []byte) {
					return int64(i) * bs, bytes.Repeat([]byte{byte('a' + i)}, bs)
				})
				for range writers {
					<-g.arrived
				}
				done := make(chan error, 1)
				go func() { done <- ops[opName](ctx, s) }()
				testutil.WaitFor(t, opName+" to wait for the writes", func() bool {
					fl := fileLocks(s, "f")
					holds := len(fl.Holders) == 1 && fl.Holders[0].Op == opName && fl.Inflight == int64(writers)
					return holds || fl.Waiting == 1
				})
				select {
				case err := <-done:
					t.Fatalf("%s returned (%v) while %d writes were inside", opName, err, writers)
				default:
				}
				g.open()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				wg.Wait()
				if _, err := os.Stat(filepath.Join(dir, "f")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("f after %s: %v, want it gone", opName, err)
				}
				if opName == "rename" {
					got := readFile(t, dir, "g")
					for i := range writers {
						if got[i*bs] != byte('a'+i) {
							t.Errorf("block %d of the renamed file holds %q, want the write's %q", i, got[i*bs], byte('a'+i))
						}
					}
				}
			})
		}
	}
}

// TestRenameRacingWrites: writers write unique records to "f" while a
// renamer moves whatever file "f" names to a fresh name, over and over.
// Under every policy, each acknowledged write is found in exactly one file
// afterwards: none was lost to a file without a name.
func TestRenameRacingWrites(t *testing.T) {
	const writers, writes, rec, renames = 4, 4000, 16, 60
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			s, dir := newTestStore(t, Options{Policy: p})
			// Writes land below EOF of a file written whole where they can,
			// so that unlocked and shared writes race the renames too.
			const fileSize = writers * writes * rec
			if _, err := s.Write(ctx, "f", 0, make([]byte, fileSize), SyncNone); err != nil {
				t.Fatal(err)
			}
			// Writers write until the renames are done (or they run out
			// of records): made[w] is how many writer w made.
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var made [writers]int
			var running atomic.Int32
			running.Store(writers)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer running.Add(-1)
					for k := range writes {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := s.Write(ctx, "f", recordOffset(w, k, writes, rec), record(w, k, rec), SyncNone); err != nil {
							t.Error(err)
							return
						}
						made[w] = k + 1
					}
				}()
			}
			done := 0
			for i := 0; done < renames && running.Load() > 0; i++ {
				err := s.Rename(ctx, "f", fmt.Sprintf("moved/%04d", i), false, i%3 == 0)
				switch {
				case err == nil:
					done++
				case !errors.Is(err, ErrNotFound): // no write since the last rename
					t.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			files := filesBelow(t, dir)
			for w := range writers {
				for k := range made[w] {
					off, want := recordOffset(w, k, writes, rec), record(w, k, rec)
					var in []string
					for name, b := range files {
						if int64(len(b)) >= off+rec && bytes.Equal(b[off:off+rec], want) {
							in = append(in, name)
						}
					}
					if len(in) != 1 {
						t.Errorf("write %d of writer %d found in %v, want exactly one file", k, w, in)
					}
				}
			}
			t.Logf("%d renames, %v writes, %d files", done, made, len(files))
		})
	}
}

func recordOffset(w, k, perWriter, size int) int64 { return int64((w*perWriter + k) * size) }

// record is a write's unique bytes: its writer and number.
func record(w, k, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint32(b, uint32(w)+1)
	binary.BigEndian.PutUint32(b[4:], uint32(k)+1)
	return b
}

// filesBelow reads every regular file below dir.
func filesBelow(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for p, e := range snapshotTree(t, dir) {
		if e.mode.IsRegular() {
			files[p] = []byte(e.content)
		}
	}
	return files
}

// TestDeleteAndReplaceRacingWrites: writers write unique records to "t"
// while, round after round, "t" is deleted, or replaced by a Rename over
// it. Under every policy, after each round's Delete or Rename returned:
// every write that started after that is in the file "t" names, and no
// write that returned before the Delete or Rename was called is (no write
// resurrects a deleted name, none reaches a forgotten inode).
func TestDeleteAndReplaceRacingWrites(t *testing.T) {
	const writers, rounds, bs = 4, 12, 4096
	// Each writer owns perWriter blocks after the marker block, used in
	// turn, so the records of one round never overwrite each other.
	const perWriter = 64
	const fileSize = (1 + writers*perWriter) * bs
	for _, op := range []string{"delete", "replace"} {
		for _, p := range Policies() {
			t.Run(op+"/"+p.String(), func(t *testing.T) {
				ctx := context.Background()
				s, dir := newTestStore(t, Options{Policy: p})
				var clock atomic.Int64
				type done struct {
					w, k       int
					start, end int64
				}
				results := make(chan done, writers)
				resume := make([]chan bool, writers) // true: one more write, then report; false: stop
				for w := range writers {
					resume[w] = make(chan bool)
				}
				// The first file: written whole (blocks below EOF, written).
				if _, err := s.Write(ctx, "t", 0, make([]byte, fileSize), SyncNone); err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				for w := range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						k := 0
						for <-resume[w] {
							// Free-running until told to report: race the
							// round's Delete or Rename.
							var last done
							for report := false; !report; {
								start := clock.Add(1)
								off := int64(1+w*perWriter+k%perWriter) * bs
								if _, err := s.Write(ctx, "t", off, record(w, k, bs), SyncNone); err != nil {
									t.Error(err)
								}
								last = done{w, k, start, clock.Add(1)}
								k++
								select {
								case report = <-resume[w]:
								default:
								}
							}
							results <- last
						}
					}()
				}
				for w := range writers {
					resume[w] <- true
				}
				var history []done
				for r := range rounds {
					if op == "replace" {
						// The replacement: written whole, marked.
						if _, err := s.Write(ctx, "src", 0, make([]byte, fileSize), SyncNone); err != nil {
							t.Fatal(err)
						}
						if _, err := s.Write(ctx, "src", 0, []byte(fmt.Sprintf("round %d", r)), SyncNone); err != nil {
							t.Fatal(err)
						}
					}
					called := clock.Add(1)
					var err error
					if op == "delete" {
						err = s.Delete(ctx, "t", false)
					} else {
						err = s.Rename(ctx, "src", "t", false, false)
					}
					if err != nil && !(op == "delete" && errors.Is(err, ErrNotFound)) {
						t.Fatal(err)
					}
					returned := clock.Add(1)
					// Each writer finishes the write it is in, makes one
					// that starts after the Delete or Rename returned and
					// reports it, then waits.
					for w := range writers {
						resume[w] <- true
					}
					var after []done
					for range writers {
						d := <-results
						// Its last write started after returned unless it
						// had none left since: then it reports an older one.
						if d.start > returned {
							after = append(after, d)
						}
					}
					got := readFile(t, dir, "t")
					if op == "replace" && !bytes.HasPrefix(got, []byte(fmt.Sprintf("round %d", r))) {
						t.Errorf("round %d: t does not start with the replacement's marker", r)
					}
					for _, d := range after {
						off := int64(1+d.w*perWriter+d.k%perWriter) * bs
						if int64(len(got)) < off+bs || !bytes.Equal(got[off:off+bs], record(d.w, d.k, bs)) {
							t.Errorf("round %d: write %d of writer %d, started after the %s returned, is not in t", r, d.k, d.w, op)
						}
					}
					for _, d := range history {
						if d.end >= called {
							continue
						}
						off := int64(1+d.w*perWriter+d.k%perWriter) * bs
						if int64(len(got)) >= off+bs && bytes.Equal(got[off:off+bs], record(d.w, d.k, bs)) {
							t.Errorf("round %d: write %d of writer %d returned before the %s was called and is still in t", r, d.k, d.w, op)
						}
					}
					history = append(history[:0], after...)
					for w := range writers {
						resume[w] <- true
					}
				}
				for w := range writers {
					resume[w] <- true // stop the free run
				}
				for range writers {
					<-results
				}
				for w := range writers {
					close(resume[w])
				}
				wg.Wait()
				// With no write running, a Delete leaves no name behind.
				if err := s.Delete(ctx, "t", true); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Stat(ctx, "t"); !errors.Is(err, ErrNotFound) {
					t.Errorf("Stat after the last Delete: %v, want %v", err, ErrNotFound)
				}
			})
		}
	}
}

// TestCrossedRenamesDoNotDeadlock: Rename(a, b) and Rename(b, a) at once,
// over and over, each renamer writing its source first, so that mostly
// both files exist and each Rename locks two files that the other also
// locks. The test ends (go test's -timeout reports a deadlock with every
// goroutine's stack).
func TestCrossedRenamesDoNotDeadlock(t *testing.T) {
	const renames = 100 // that found a file, by each renamer
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			s, _ := newTestStore(t, Options{Policy: p})
			var wg sync.WaitGroup
			var attempts atomic.Int64
			for i, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done := 0; done < renames; {
						attempts.Add(1)
						if _, err := s.Write(ctx, pair[0], int64(i)*512, make([]byte, 512), SyncNone); err != nil {
							t.Error(err)
							return
						}
						// NotFound when the other moved the file away
						// between the two calls.
						switch err := s.Rename(ctx, pair[0], pair[1], false, false); {
						case err == nil:
							done++
						case !errors.Is(err, ErrNotFound):
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%d renames in %d attempts", 2*renames, attempts.Load())
		})
	}
}

// TestCreationIsOneStep: while a Write that creates a file is inside the
// store, a Stat, Read or Extents of that file waits for it rather than see
// the file empty, and then sees what it wrote.
func TestCreationIsOneStep(t *testing.T) {
	ctx := context.Background()
	looks := map[string]func(s *Store) (int64, error){
		"stat": func(s *Store) (int64, error) {
			st, err := s.Stat(ctx, "new")
			return st.Size, err
		},
		"read": func(s *Store) (int64, error) {
			b, err := s.Read(ctx, "new", 0, 1<<20)
			return int64(len(b)), err
		},
		"extents": func(s *Store) (int64, error) {
			ext, err := s.Extents(ctx, "new", 0, 0)
			var n int64
			for _, e := range ext {
				n += e.Length
			}
			return n, err
		},
	}
	for _, name := range []string{"stat", "read", "extents"} {
		t.Run(name, func(t *testing.T) {
			g := newGate(t, 1)
			s, _ := newTestStore(t, Options{Hooks: g.hooks()})
			wrote := make(chan error, 1)
			go func() {
				_, err := s.Write(ctx, "new", 0, make([]byte, 8192), SyncNone)
				wrote <- err
			}()
			<-g.arrived
			looked := inBackground(func() (int64, error) { return looks[name](s) })
			testutil.WaitFor(t, name+" to wait for the creating write", func() bool {
				select {
				case r := <-looked:
					t.Fatalf("%s returned %d, %v while the write that creates the file was inside", name, r.size, r.err)
				default:
				}
				return fileLocks(s, "new").Waiting == 1
			})
			g.open()
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			if r := <-looked; r.err != nil || r.size != 8192 {
				t.Errorf("%s = %d, %v; want the 8192 bytes written", name, r.size, r.err)
			}
		})
	}
}

// TestCreateAfterDeleteIsOneStep: a Truncate or Fallocate that found the
// file, which a Delete then removed before the operation locked it,
// creates the file anew, and like any create it holds the new inode's
// lock from before anyone can reach it: a Stat meanwhile waits for it
// rather than see the file empty. The operation once let go of the inode
// it found and looked the name up again; when the Delete forgot the inode
// in between, that second lookup created the file unlocked
// (TestLinearizability saw a Read of it return nothing). The test holds
// the operation in that gap, where it asks whether it created the file
// (the found inode's lock's mutex, held here), until the Delete is done.
func TestCreateAfterDeleteIsOneStep(t *testing.T) {
	ctx := context.Background()
	ops := map[string]struct {
		do   func(s *Store) error
		size int64
	}{
		"truncate": {func(s *Store) error { return s.Truncate(ctx, "f", 3000) }, 3000},
		"fallocate": {func(s *Store) error {
			_, err := s.Fallocate(ctx, "f", FallocAllocate, 0, 4096)
			return err
		}, 4096},
	}
	for _, name := range []string{"truncate", "fallocate"} {
		op := ops[name]
		t.Run(name, func(t *testing.T) {
			s, h, _ := newHookStore(t, Options{})
			if _, err := s.Write(ctx, "f", 0, make([]byte, 8192), SyncNone); err != nil {
				t.Fatal(err)
			}
			removed, resizing := make(chan struct{}, 1), make(chan struct{}, 1)
			letDelete, letResize := testutil.NewGate(t), testutil.NewGate(t)
			h.afterRemove = func(string, error) {
				removed <- struct{}{}
				<-letDelete.Opened()
			}
			h.beforeResize = func(string) {
				resizing <- struct{}{}
				<-letResize.Opened()
			}
			old := lookupInode(t, s, "f")

			// The Delete holds the old inode's lock, the file unlinked.
			deleted := make(chan error, 1)
			go func() { deleted <- s.Delete(ctx, "f", false) }()
			<-removed

			// The operation finds the old inode and stops where it asks
			// whether it created it.
			old.lock.mu.Lock()
			done := make(chan error, 1)
			go func() { done <- op.do(s) }()
			testutil.WaitFor(t, name+" to find the file", func() bool {
				s.table.mu.Lock()
				defer s.table.mu.Unlock()
				return old.refs == 2 // the Delete's and the operation's
			})
			letDelete.Open()
			testutil.WaitFor(t, "the Delete to forget the file", old.deleted.Load)
			old.lock.mu.Unlock()
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}

			// The operation has created the file anew and is inside
			// ftruncate(2) or fallocate(2): a Stat must wait for it.
			<-resizing
			statted := inBackground(func() (int64, error) {
				st, err := s.Stat(ctx, "f")
				return st.Size, err
			})
			testutil.WaitFor(t, "Stat to wait for the "+name+" that creates f", func() bool {
				select {
				case r := <-statted:
					t.Fatalf("Stat returned size %d, %v while the %s that creates f was inside", r.size, r.err, name)
				default:
				}
				return fileLocks(s, "f").Waiting == 1
			})
			letResize.Open()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if r := <-statted; r.err != nil || r.size != op.size {
				t.Errorf("Stat = %d, %v; want the %s's size %d", r.size, r.err, name, op.size)
			}
		})
	}
}

// TestRenameIsOneStepToStat: a Stat of the new name and then one of the
// old, while Rename(b, dir/c) is between its rename(2) and the table's
// re-keying, agree with one order of the calls: once the new name shows
// the renamed file, the old name shows nothing. TestLinearizability once
// saw both show it: the Stat of dir/c found the file it replaced unlinked
// (fstat(2) said st_nlink 0), opened dir/c afresh, and reached the renamed
// file, which the table still knew by b. The test holds the Rename just
// after rename(2), and a Stat of the new name either returns or waits for
// the Rename.
func TestRenameIsOneStepToStat(t *testing.T) {
	ctx := context.Background()
	const size, replacedSize = 12289, 8193
	for _, tt := range []struct {
		name    string
		replace bool
	}{
		{"over a file", true},
		{"to a free name", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, h, _ := newHookStore(t, Options{})
			if _, err := s.Write(ctx, "b", 0, make([]byte, size), SyncNone); err != nil {
				t.Fatal(err)
			}
			if tt.replace {
				if _, err := s.Write(ctx, "dir/c", 0, make([]byte, replacedSize), SyncNone); err != nil {
					t.Fatal(err)
				}
			}
			renamed := make(chan struct{}, 1)
			letRename := testutil.NewGate(t)
			h.afterRename = func(string, string, error) {
				renamed <- struct{}{}
				<-letRename.Opened()
			}
			done := make(chan error, 1)
			go func() { done <- s.Rename(ctx, "b", "dir/c", false, false) }()
			<-renamed

			statted := inBackground(func() (int64, error) {
				st, err := s.Stat(ctx, "dir/c")
				return st.Size, err
			})
			var early *sizeResult // the Stat of dir/c, if it returned while the Rename was held
			testutil.WaitFor(t, "Stat(dir/c) to return or wait for the Rename", func() bool {
				select {
				case r := <-statted:
					early = &r
					return true
				default:
				}
				s.table.mu.Lock()
				defer s.table.mu.Unlock()
				ino := s.table.byPath["dir/c"]
				if ino == nil || ino.refs < 2 {
					return false
				}
				select {
				case <-ino.ready:
					return false // an open inode: Stat does not wait for it
				default:
					return true // the Rename's reservation, with Stat waiting for it
				}
			})
			old, oldErr := s.Stat(ctx, "b")
			if early != nil && early.err == nil && early.size == size && oldErr == nil {
				t.Errorf("while Rename(b, dir/c) ran, Stat(dir/c) = %d and then Stat(b) = %d: the file was under its new name and then under its old",
					early.size, old.Size)
			}

			letRename.Open()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if early == nil {
				r := <-statted
				early = &r
			}
			if early.err != nil || early.size != size {
				t.Errorf("Stat(dir/c) = %d, %v; want the renamed file's %d", early.size, early.err, size)
			}
			if _, err := s.Stat(ctx, "b"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Stat(b) after the Rename: %v, want %v", err, ErrNotFound)
			}
		})
	}
}

// TestRenameOntoItselfAgreesWithTheDirectory: Rename of a name onto
// itself reports whether the name names a file as every other call sees
// the directory. A black-box linearizability check found one answering
// OK from the table, which still held the file while a Delete of it,
// its unlink(2) done, had yet to forget it: Lists had already shown the
// name gone. Held there, the Delete keeps the Rename waiting, which then
// finds nothing (ErrNotFound); and a file removed from outside is not
// found either.
func TestRenameOntoItselfAgreesWithTheDirectory(t *testing.T) {
	ctx := context.Background()
	t.Run("a Delete between its unlink and its forgetting", func(t *testing.T) {
		s, h, _ := newHookStore(t, Options{Policy: PolicySharedWritten})
		if _, err := s.Write(ctx, "d0/y", 0, []byte("y"), SyncNone); err != nil {
			t.Fatal(err)
		}
		removed := make(chan struct{}, 1)
		letDelete := testutil.NewGate(t)
		h.afterRemove = func(string, error) {
			removed <- struct{}{}
			<-letDelete.Opened()
		}
		deleted := make(chan error, 1)
		go func() { deleted <- s.Delete(ctx, "d0/y", false) }()
		<-removed
		if names := listNames(t, s, "d0"); len(names) != 0 {
			t.Fatalf("List(d0) while the Delete is held: %v, want none", names)
		}
		renamed := make(chan error, 1)
		go func() { renamed <- s.Rename(ctx, "d0/y", "d0/y", false, false) }()
		testutil.WaitFor(t, "Rename(d0/y, d0/y) to answer or wait for the Delete", func() bool {
			select {
			case err := <-renamed:
				renamed <- err
				return true
			default:
			}
			return fileLocks(s, "d0/y").Waiting == 1
		})
		select {
		case err := <-renamed:
			t.Fatalf("Rename(d0/y, d0/y) answered %v while the Delete of d0/y, which List had seen, was held", err)
		default:
		}
		letDelete.Open()
		if err := <-deleted; err != nil {
			t.Fatal(err)
		}
		if err := <-renamed; !errors.Is(err, ErrNotFound) {
			t.Errorf("Rename(d0/y, d0/y) after the Delete: %v, want ErrNotFound", err)
		}
	})
	t.Run("removed from outside", func(t *testing.T) {
		s, dir := newTestStore(t, Options{})
		if _, err := s.Write(ctx, "y", 0, []byte("y"), SyncNone); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(dir, "y")); err != nil {
			t.Fatal(err)
		}
		if err := s.Rename(ctx, "y", "y", false, false); !errors.Is(err, ErrNotFound) {
			t.Errorf("Rename(y, y) after rm y: %v, want ErrNotFound", err)
		}
		if _, err := s.Write(ctx, "y", 0, []byte("again"), SyncNone); err != nil {
			t.Fatal(err)
		}
		if err := s.Rename(ctx, "y", "y", false, false); err != nil {
			t.Errorf("Rename(y, y) of a file: %v, want nil", err)
		}
	})
}

// listNames lists the names in dir.
func listNames(t *testing.T, s *Store, dir string) []string {
	t.Helper()
	entries, _, err := s.List(context.Background(), dir, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	return names
}

// lookupInode is the inode the table knows by name, which must be open.
func lookupInode(t *testing.T, s *Store, name string) *inode {
	t.Helper()
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	ino := s.table.byPath[name]
	if ino == nil {
		t.Fatalf("%s is not open", name)
	}
	return ino
}
