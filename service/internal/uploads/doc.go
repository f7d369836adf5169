// Package uploads is the tus door: resumable uploads under /v1/uploads/
// (tus 1.0, https://tus.io/protocols/resumable-upload; docs/uploads.md).
// tusd's handler (github.com/tus/tusd/v2/pkg/handler) speaks the protocol
// and its extensions creation, creation-with-upload,
// creation-defer-length, termination and concatenation; this package is
// its data store over the daemon's store, its locker (tusd's in-memory
// one: one request at a time per upload, in this process), and a thin
// layer around the handler for what tusd leaves out: the checksum and
// expiration extensions.
//
// An upload's bytes go into a staged file (store.OpenStaged: in the
// store's state directory, on the same filesystem, out of List's sight),
// and its length, metadata and target path into a record beside it
// (store.PutRecord). Each PATCH is synced (fdatasync) before its
// Upload-Offset is answered, so an acknowledged byte survives a SIGKILL
// of the daemon and a power cut; after a restart an upload's offset is
// its staged file's size. The last PATCH publishes the file
// (store.Publish: fsync, rename onto the target, sync of both
// directories): the target appears whole, or not at all. A concatenation
// copies its partial uploads into its own staged file with
// copy_file_range (store.Handle.CopyFrom) and publishes it.
//
// Every operation runs under the FileService's checks (Calls: in the
// daemon, the direct road of service/internal/local), as the call it
// stands for: a PATCH as a Write of the target, a HEAD as a Stat, a DELETE
// as a Delete, the publish as a Rename onto the target; so the token, the
// scope, the log line and the span are those of every other face. An
// upload is also tied to the credential that created it (Config.Owner):
// another credential gets 404 for it, whatever its scope.
//
// Lock order: tusd's per-upload lock (memorylocker) is taken before any
// of the store's; the sweeper takes it too, without waiting, before it
// removes an expired upload.
package uploads
