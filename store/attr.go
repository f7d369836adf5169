//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"os"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Attributes are small named values kept with a file or a directory, in
// its extended attributes (xattr(7)) under "user.filewrite.": a file's
// media type (AttrContentType), a WebDAV client's dead properties. They
// follow the file through Rename and Publish, and go with it on Delete.
// An attribute is metadata: durable once the file is synced whole (Fsync
// without data_only, SyncFull), or, for a directory, once it is synced.
//
// A filesystem without user extended attributes (tmpfs before Linux 6.6,
// some network filesystems), or an FS layer that does not pass them
// through, keeps none: setting one fails with ErrUnsupported, and reading
// one finds nothing.

// Attribute names the store knows.
const (
	// AttrContentType is a file's media type, as a PUT's Content-Type gave
	// it: served on its downloads.
	AttrContentType = "content_type"
	// MaxContentTypeLen bounds a media type.
	MaxContentTypeLen = 255
	// MaxAttrLen bounds an attribute's value: Linux's own bound is 64
	// KiB, ext4 keeps a file's attributes in one block (4 KiB) and
	// refuses more with ENOSPC, which the store answers as
	// ErrFileTooLarge, naming the attribute.
	MaxAttrLen = 64 << 10
	// attrPrefix is where in the xattr namespaces the store keeps its
	// attributes.
	attrPrefix = "user.filewrite."
)

// attrFile is a File that keeps attributes (the operating system's
// files). Each call is one syscall on the file's descriptor.
type attrFile interface {
	// getAttr returns the attribute's value; nil, nil if it is not set.
	getAttr(name string) ([]byte, error)
	// setAttr sets the attribute; a nil value removes it (no error if it
	// was not set).
	setAttr(name string, value []byte) error
}

// attrFS is an FS that keeps attributes of files and directories by name.
type attrFS interface {
	getAttr(name, attr string) ([]byte, error)
	setAttr(name, attr string, value []byte) error
}

var (
	_ attrFile = (*osFile)(nil)
	_ attrFS   = (*OSFS)(nil)
)

func validateAttr(name string, value []byte) error {
	if name == "" || len(name) > 64 {
		return refuse(ErrInvalidMode, "attribute", "attribute name %q: want 1 to 64 bytes", name)
	}
	if len(value) > MaxAttrLen {
		return refuseLimit(ErrRequestTooLarge, "attribute", MaxAttrLen, "attribute %s of %d bytes, the limit is %d", name, len(value), MaxAttrLen)
	}
	return nil
}

// SetAttr sets the attribute name of the file or directory path to value,
// or removes it when value is nil. Durable when it returns: nothing, until
// path is synced (Fsync without data_only).
func (s *Store) SetAttr(ctx context.Context, path, name string, value []byte) error {
	if err := validatePath(path); err != nil {
		return err
	}
	if err := validateAttr(name, value); err != nil {
		return err
	}
	afs, ok := s.fsys.(attrFS)
	if !ok {
		return fmt.Errorf("%w: attributes: the file layer keeps none", ErrUnsupported)
	}
	return attrError(path, name, afs.setAttr(path, name, value))
}

// Attr returns the attribute name of the file or directory path; nil if
// it has none, or the filesystem keeps none.
func (s *Store) Attr(ctx context.Context, path, name string) ([]byte, error) {
	if err := validatePath(path); err != nil {
		return nil, err
	}
	if err := validateAttr(name, nil); err != nil {
		return nil, err
	}
	afs, ok := s.fsys.(attrFS)
	if !ok {
		return nil, nil
	}
	v, err := afs.getAttr(path, name)
	if errors.Is(err, ErrUnsupported) {
		return nil, nil
	}
	return v, attrError(path, name, err)
}

// ErrInvalidContentType is returned for a media type that is not one
// (CheckContentType).
var ErrInvalidContentType = errors.New("invalid content type")

// CheckContentType checks a media type as a file keeps it
// (AttrContentType) and returns it normalized (type, subtype and
// parameter names in lower case): type/subtype with parameters, printable
// ASCII, at most MaxContentTypeLen bytes.
func CheckContentType(ct string) (string, error) {
	if len(ct) > MaxContentTypeLen {
		return "", refuseLimit(ErrInvalidContentType, "content_type", MaxContentTypeLen, "media type of %d bytes, the limit is %d", len(ct), MaxContentTypeLen)
	}
	for i := 0; i < len(ct); i++ {
		if ct[i] < 0x20 || ct[i] > 0x7e {
			return "", refuse(ErrInvalidContentType, "content_type", "media type %q: want printable ASCII", ct)
		}
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || !strings.Contains(mt, "/") || strings.HasPrefix(mt, "/") || strings.HasSuffix(mt, "/") {
		return "", refuse(ErrInvalidContentType, "content_type", "%q is not a media type (type/subtype, such as image/png)", ct)
	}
	return mime.FormatMediaType(mt, params), nil
}

// SetContentType gives the file path the media type ct (CheckContentType
// first: a type refused changes nothing). ErrUnsupported where the
// filesystem keeps no attributes. Durable when it returns: nothing, until
// the file's next full sync.
func (s *Store) SetContentType(ctx context.Context, path, ct string) error {
	ct, err := CheckContentType(ct)
	if err != nil {
		return err
	}
	return s.SetAttr(ctx, path, AttrContentType, []byte(ct))
}

// SetAttr sets an attribute of the Handle's file, as Store.SetAttr does.
func (h *Handle) SetAttr(name string, value []byte) error {
	if err := validateAttr(name, value); err != nil {
		return err
	}
	af, ok := h.ino.file.(attrFile)
	if !ok {
		return fmt.Errorf("%w: attributes: the file layer keeps none", ErrUnsupported)
	}
	return attrError(h.path, name, af.setAttr(name, value))
}

// contentType is the file's media type (AttrContentType), "" if it has
// none or its filesystem keeps none.
func (ino *inode) contentType() string {
	af, ok := ino.file.(attrFile)
	if !ok {
		return ""
	}
	v, err := af.getAttr(AttrContentType)
	if err != nil {
		return ""
	}
	return string(v)
}

// attrError maps an xattr syscall's error.
func attrError(path, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnsupported):
		return fmt.Errorf("%w: attribute %s of %s: the filesystem keeps no extended attributes", ErrUnsupported, name, path)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.E2BIG), errors.Is(err, syscall.ERANGE):
		return refuse(ErrFileTooLarge, "attribute", "attribute %s of %s: more than the filesystem keeps with one file", name, path)
	}
	return mapOpenErr(path, err)
}

func (f *osFile) getAttr(name string) ([]byte, error) {
	return getxattr(f.fd, attrPrefix+name)
}

func (f *osFile) setAttr(name string, value []byte) error {
	return setxattr(f.fd, attrPrefix+name, value)
}

// getAttr opens name (a file or a directory) for its descriptor.
func (f *OSFS) getAttr(name, attr string) ([]byte, error) {
	d, err := f.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	v, err := getxattr(int(d.Fd()), attrPrefix+attr)
	runtime.KeepAlive(d)
	return v, err
}

func (f *OSFS) setAttr(name, attr string, value []byte) error {
	d, err := f.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	err = setxattr(int(d.Fd()), attrPrefix+attr, value)
	runtime.KeepAlive(d)
	return err
}

// getxattr is fgetxattr(2): nil, nil for an attribute that is not set.
func getxattr(fd int, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(fd, name, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ENODATA:
			return nil, nil
		case err == unix.ERANGE && len(buf) < MaxAttrLen:
			buf = make([]byte, MaxAttrLen)
			continue
		case err == unix.EOPNOTSUPP:
			return nil, ErrUnsupported
		case err != nil:
			return nil, err
		}
		return buf[:n:n], nil
	}
}

// setxattr is fsetxattr(2), or fremovexattr(2) for a nil value.
func setxattr(fd int, name string, value []byte) error {
	for {
		var err error
		if value == nil {
			err = unix.Fremovexattr(fd, name)
			if err == unix.ENODATA {
				err = nil
			}
		} else {
			err = unix.Fsetxattr(fd, name, value, 0)
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EOPNOTSUPP:
			return ErrUnsupported
		}
		return err
	}
}
