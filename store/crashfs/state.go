package crashfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// State is what an FS held when it crashed: for each file and directory,
// what was durable and the operations since. It is immutable and safe for
// concurrent use.
type State struct {
	root *dirNode
}

// PieceKind says what part of an operation a Piece is.
type PieceKind int

const (
	// PieceData is the bytes one write put into one block.
	PieceData PieceKind = iota + 1
	// PieceSize is a write's growth of the file size (none if it did not
	// grow it). Kept without the data, the file ends in zeros; the data
	// kept without it, what lies past the size is lost.
	PieceSize
	// PieceTruncate is a whole truncate.
	PieceTruncate
	// PieceFallocate is a whole fallocate.
	PieceFallocate
	// PieceLink is a directory entry created, or replaced by a rename.
	PieceLink
	// PieceUnlink is a directory entry removed.
	PieceUnlink
	// PieceRename is a whole rename: the old name's removal and the new
	// name's link, which replaces what the new name named.
	PieceRename
)

func (k PieceKind) String() string {
	switch k {
	case PieceData:
		return "data"
	case PieceSize:
		return "size"
	case PieceTruncate:
		return "truncate"
	case PieceFallocate:
		return "fallocate"
	case PieceLink:
		return "link"
	case PieceUnlink:
		return "unlink"
	case PieceRename:
		return "rename"
	}
	return fmt.Sprintf("PieceKind(%d)", int(k))
}

// Piece is one part of an operation that was not durable at the crash,
// which the power cut may have kept or lost independently of the others.
type Piece struct {
	Kind PieceKind
	// Path is the directory entry's path (a rename's new name), or the
	// path the file was created under.
	Path string
	// From is a rename's old name.
	From string
	// Seq numbers the operation: operations completed in Seq order, and
	// the pieces of one operation share it.
	Seq uint64
	// Block is the file block (of the file's st_blksize) of a PieceData.
	Block int64
}

func (p Piece) String() string {
	switch p.Kind {
	case PieceData:
		return fmt.Sprintf("#%d %v %s block %d", p.Seq, p.Kind, p.Path, p.Block)
	case PieceRename:
		return fmt.Sprintf("#%d %v %s to %s", p.Seq, p.Kind, p.From, p.Path)
	}
	return fmt.Sprintf("#%d %v %s", p.Seq, p.Kind, p.Path)
}

// Keep says whether a piece survived the power cut. A directory entry
// change kept keeps, whatever Keep says of them, the earlier changes of
// the same entry and those that put the directories above it in place.
type Keep func(Piece) bool

// KeepNone loses everything that was not durable: the state a correct
// store is most likely to be caught out by.
func KeepNone(Piece) bool { return false }

// KeepAll keeps everything, as if the cut came just after a sync of
// everything.
func KeepAll(Piece) bool { return true }

// KeepRandom keeps each piece with probability p, drawing from rng: any
// subset, in no order, as a disk that reorders its writes can leave.
func KeepRandom(rng *rand.Rand, p float64) Keep {
	return func(Piece) bool { return rng.Float64() < p }
}

// KeepBefore keeps the pieces of the operations numbered below seq: a
// prefix in completion order, as an ordered journal would leave.
func KeepBefore(seq uint64) Keep {
	return func(p Piece) bool { return p.Seq < seq }
}

// LastSeq is the number of the last operation recorded, for KeepBefore.
func (s *State) LastSeq() uint64 {
	var last uint64
	s.walk(func(p Piece, _ []Piece) { last = max(last, p.Seq) })
	return last
}

// Pieces lists the pieces that were not durable, directory entries first,
// each file's in order.
func (s *State) Pieces() []Piece {
	var out []Piece
	s.walk(func(p Piece, _ []Piece) { out = append(out, p) })
	return out
}

// walk calls fn for every piece not durable, of every directory and file
// in the tree as the FS last saw it or as some directory durably held it,
// each once, in a fixed order, with the pieces a kept one keeps (durable
// ones among them).
func (s *State) walk(fn func(p Piece, above []Piece)) {
	seenDir := make(map[*dirNode]bool)
	seenFile := make(map[*fileNode]bool)
	seenRename := make(map[*renameOp]bool)
	var visitFile func(fn *fileNode)
	var visit func(d *dirNode)
	visit = func(d *dirNode) {
		if seenDir[d] {
			return
		}
		seenDir[d] = true
		for _, op := range d.pending {
			if op.durable(d) || op.rename != nil && seenRename[op.rename] {
				continue
			}
			if op.rename != nil {
				seenRename[op.rename] = true // listed once, from either side
			}
			fn(op.piece())
		}
		for _, m := range []map[string]*node{d.durable, d.live} {
			for _, name := range sortedNames(m) {
				if n := m[name]; n.dir != nil {
					visit(n.dir)
				} else {
					visitFile(n.file)
				}
			}
		}
		for _, op := range d.pending {
			if op.target != nil && op.target.dir != nil {
				visit(op.target.dir)
			} else if op.target != nil {
				visitFile(op.target.file)
			}
		}
	}
	visitFile = func(f *fileNode) {
		if seenFile[f] {
			return
		}
		seenFile[f] = true
		for _, op := range f.ops[f.durable:] {
			if op.synced {
				continue
			}
			for _, p := range f.pieces(op) {
				fn(p, nil)
			}
		}
	}
	visit(s.root)
}

// pieces cuts a file operation into the parts that survive independently.
func (f *fileNode) pieces(op fileOp) []Piece {
	switch op.kind {
	case opTruncate:
		return []Piece{{Kind: PieceTruncate, Path: f.path, Seq: op.seq}}
	case opFallocate:
		return []Piece{{Kind: PieceFallocate, Path: f.path, Seq: op.seq}}
	}
	end := op.off + int64(len(op.data))
	var out []Piece
	for b := op.off / f.blockSize; b*f.blockSize < end; b++ {
		out = append(out, Piece{Kind: PieceData, Path: f.path, Seq: op.seq, Block: b})
	}
	return append(out, Piece{Kind: PieceSize, Path: f.path, Seq: op.seq})
}

// Image says what one crashed image kept.
type Image struct {
	// Kept and Lost count the pieces that were not durable.
	Kept, Lost int
}

// Write makes the crashed image that keep chooses in dir, which must exist
// and be empty: the directories and files reachable from the root through
// the entries each directory durably held plus the entry changes kept,
// each file holding its durable operations plus those of its later
// operations' pieces kept, replayed in completion order. A file reached
// under several names is hard-linked. keep is asked about each piece once,
// in the order of Pieces.
func (s *State) Write(dir string, keep Keep) (Image, error) {
	kept := make(map[Piece]bool)
	above := make(map[Piece][]Piece)
	var all []Piece
	s.walk(func(p Piece, a []Piece) {
		all = append(all, p)
		above[p] = a
		if keep(p) {
			kept[p] = true
		}
	})
	// A kept entry change keeps the changes it follows, up to the root:
	// each of those pieces lists its own.
	for grew := true; grew; {
		grew = false
		for _, p := range all {
			if !kept[p] {
				continue
			}
			for _, q := range above[p] {
				if _, pending := above[q]; pending && !kept[q] {
					kept[q], grew = true, true
				}
			}
		}
	}
	img := Image{Kept: len(kept), Lost: len(all) - len(kept)}
	w := imageWriter{kept: kept, files: make(map[*fileNode]string), dirs: make(map[*dirNode]bool)}
	if err := w.writeDir(s.root, dir); err != nil {
		return img, err
	}
	return img, nil
}

type imageWriter struct {
	kept  map[Piece]bool
	files map[*fileNode]string // written files, by their first path
	dirs  map[*dirNode]bool
}

// entries is what directory d holds in the image.
func (w *imageWriter) entries(d *dirNode) map[string]*node {
	out := make(map[string]*node, len(d.durable))
	for name, n := range d.durable {
		out[name] = n
	}
	for _, op := range d.pending {
		if p, _ := op.piece(); !op.durable(d) && !w.kept[p] {
			continue
		}
		if op.target == nil {
			delete(out, op.name)
		} else {
			out[op.name] = op.target
		}
	}
	return out
}

func (w *imageWriter) writeDir(d *dirNode, osDir string) error {
	if w.dirs[d] {
		return nil // a directory reached twice: the first name has it
	}
	w.dirs[d] = true
	ents := w.entries(d)
	for _, name := range sortedNames(ents) {
		n, p := ents[name], filepath.Join(osDir, name)
		if n.dir != nil {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := w.writeDir(n.dir, p); err != nil {
				return err
			}
			continue
		}
		if first, ok := w.files[n.file]; ok {
			if err := os.Link(first, p); err != nil {
				return err
			}
			continue
		}
		w.files[n.file] = p
		if err := w.writeFile(n.file, p); err != nil {
			return fmt.Errorf("crashfs: image of %s: %w", n.file.path, err)
		}
	}
	return nil
}

// writeFile replays f's durable operations and the kept pieces of the
// rest onto a new file at osPath.
func (w *imageWriter) writeFile(f *fileNode, osPath string) (err error) {
	out, err := os.OpenFile(osPath, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	fd := int(out.Fd())
	var size int64
	for i, op := range f.ops {
		durable := i < f.durable || op.synced
		keep := func(p Piece) bool { return durable || w.kept[p] }
		switch op.kind {
		case opTruncate:
			if keep(Piece{Kind: PieceTruncate, Path: f.path, Seq: op.seq}) {
				if err := out.Truncate(op.size); err != nil {
					return err
				}
				size = op.size
			}
		case opFallocate:
			if keep(Piece{Kind: PieceFallocate, Path: f.path, Seq: op.seq}) {
				if err := unix.Fallocate(fd, op.mode, op.off, op.size); err != nil {
					return fmt.Errorf("fallocate: %w", err)
				}
				if op.mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
					size = max(size, op.off+op.size)
				}
			}
		case opWrite:
			end := op.off + int64(len(op.data))
			grows := keep(Piece{Kind: PieceSize, Path: f.path, Seq: op.seq})
			limit := size // without its size piece, nothing past EOF lands
			if grows {
				limit = max(size, end)
			}
			for b := op.off / f.blockSize; b*f.blockSize < end; b++ {
				if !keep(Piece{Kind: PieceData, Path: f.path, Seq: op.seq, Block: b}) {
					continue
				}
				lo, hi := max(op.off, b*f.blockSize), min(end, (b+1)*f.blockSize, limit)
				if lo >= hi {
					continue
				}
				if _, err := out.WriteAt(op.data[lo-op.off:hi-op.off], lo); err != nil {
					return err
				}
			}
			if grows && end > size {
				// The blocks written may not reach the end: the rest
				// reads as zeros.
				if err := out.Truncate(end); err != nil {
					return err
				}
				size = end
			}
		}
	}
	return nil
}

func sortedNames(m map[string]*node) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
