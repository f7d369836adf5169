package testutil

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The real NBD clients the tests of the NBD export drive: libnbd's tools
// and Python binding, qemu's, fio. .ci/run installs them all (Debian:
// libnbd-bin, python3-libnbd, qemu-utils, fio).

// NeedTool skips t, saying what to install, when a client tool is
// missing.
func NeedTool(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (Debian: libnbd-bin, python3-libnbd, qemu-utils, fio; .ci/run installs them)", tool)
		}
	}
}

// Run runs a client tool and returns its standard output; it fails t
// unless the tool exits 0 within two minutes.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := RunErr(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

// RunErr runs a client tool for at most two minutes; its error carries
// the tool's standard error.
func RunErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.Join(err, errors.New(stderr.String()))
	}
	return stdout.String(), nil
}

// NBDPython returns a Python that has libnbd's binding (nbdsh's), or
// skips t. Debian's binding is for its own python3, which another one
// first on PATH may hide.
func NBDPython(t testing.TB) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import nbd").Run() == nil {
			return py
		}
	}
	t.Skip("libnbd's Python binding is not installed (Debian: python3-libnbd; .ci/run installs it)")
	return ""
}

// NBDScript runs a Python script with libnbd's binding and returns what
// it printed. The script finds nbd and errno imported, uri bound, and
// connect(strict=True) to make a handle connected to uri (strict=False
// turns off libnbd's own checks, so that what it would refuse reaches the
// server; the URI may name local files, as tls-certificates= does).
func NBDScript(t testing.TB, uri, script string) string {
	t.Helper()
	return Run(t, NBDPython(t), "-c", nbdPrelude(uri)+script)
}

// nbdPrelude binds what NBDScript's scripts find, and pause().
func nbdPrelude(uri string) string {
	return fmt.Sprintf("import nbd, errno, sys\nuri = %q\ndef connect(strict=True):\n    h = nbd.NBD()\n"+
		"    if not strict:\n        h.set_strict_mode(0)\n    h.set_uri_allow_local_file(True)\n"+
		"    h.connect_uri(uri)\n    return h\n"+
		"def pause():\n    print(%q, flush=True)\n    sys.stdin.readline()\n", uri, nbdPauseMark)
}

// nbdPauseMark is the line pause() prints.
const nbdPauseMark = "-- paused --"

// NBDScriptPaused is NBDScript for a script that calls pause() once: the
// script stops there while at runs, then goes on. It returns what the
// script printed besides the pause.
func NBDScriptPaused(t testing.TB, uri, script string, at func()) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, NBDPython(t), "-c", nbdPrelude(uri)+script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if sc.Text() == nbdPauseMark {
			at()
			stdin.Write([]byte("\n"))
			continue
		}
		out.WriteString(sc.Text() + "\n")
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the script: %v\n%s%s", err, out.String(), stderr.String())
	}
	return out.String()
}

// LibnbdCerts writes the directory that libnbd's tls-certificates= names
// into dir/name: ca-cert.pem, the certificate that verifies the server's
// (serverCertFile, a self-signed one), and client-cert.pem and
// client-key.pem, the client's. It returns the directory.
func LibnbdCerts(t testing.TB, dir, name, serverCertFile string, client tls.Certificate) string {
	t.Helper()
	certs := filepath.Join(dir, name)
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	serverPEM, err := os.ReadFile(serverCertFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(client.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string][]byte{
		"ca-cert.pem":     serverPEM,
		"client-cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: client.Certificate[0]}),
		"client-key.pem":  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
	} {
		if err := os.WriteFile(filepath.Join(certs, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certs
}
