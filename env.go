package main

import (
	"flag"
	"fmt"
	"strings"
)

// envPrefix starts the name of every flag's environment variable.
const envPrefix = "FILEWRITE_"

// notFromEnv are the flags that no environment variable sets: they ask for
// something other than a daemon, and a variable left in a container's
// environment would turn every start into that.
var notFromEnv = map[string]bool{"version": true}

// envName is the environment variable of a flag: --max-open-files is
// FILEWRITE_MAX_OPEN_FILES.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// setFromEnv sets, through fs, every flag that the command line did not
// give and whose environment variable lookup finds (set, even to the empty
// string: FILEWRITE_HTTP_ADDR= turns the gateway off as --http-addr= does).
// Setting through fs marks the flag as given, so that fs.Visit, and the
// defaults derived from it, treat it as if it had been on the command line.
// Variables that name no flag are ignored: FILEWRITE_* is also used by
// tests and by deploy/haproxy.cfg.
func setFromEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || notFromEnv[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%q (--%s): %w", name, v, f.Name, serr)
		}
	})
	return err
}

// usage is -help: the flags, each with its variable.
func usage(fs *flag.FlagSet) {
	out := fs.Output()
	fmt.Fprintf(out, `Usage: filewrite [flags]
       filewrite probe [probe flags]   (filewrite probe -help)
       filewrite --version

Every flag can also be set by an environment variable named after it:
--max-open-files by %sMAX_OPEN_FILES, and so on (not --version). A flag
on the command line wins over its variable.

`, envPrefix)
	fs.PrintDefaults()
}
