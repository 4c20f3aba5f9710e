// Package cmdmain is what the etcd module's commands share around their run
// function: the exit status its error decides, and the role of a copy of
// the command that the command started itself.
package cmdmain

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// UsageError is a bad flag or argument: Exit exits with status 2 and points
// at -h.
type UsageError struct{ error }

// Usage wraps err as a UsageError.
func Usage(err error) error { return UsageError{err} }

func (e UsageError) Unwrap() error { return e.error }

// Exit ends the command name after its run returned err: status 0 for nil
// or flag.ErrHelp, 2 for a UsageError, 1 for any other error, which is
// printed with the command's name.
func Exit(name string, err error) {
	var ue UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "%s: %v\nrun '%s -h' for the flags\n", name, err, name)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Copy runs role, and exits, if this process is a copy of the command that
// the command started with the environment variable env set to "1" (a
// test binary's TestMain calls it too, so that the test can start itself
// the same way). Otherwise it returns at once. role reads its orders from
// stdin and writes its answers to stdout; its error ends the process with
// status 1, printed with name.
func Copy(name, env string, role func(stdin io.Reader, stdout io.Writer) error) {
	if os.Getenv(env) != "1" {
		return
	}
	if err := role(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Parse parses args with fs, which takes no positional arguments: it
// returns flag.ErrHelp for -h, and a UsageError for a bad flag or an
// argument left over.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return Usage(err)
	}
	if fs.NArg() > 0 {
		return Usage(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	return nil
}
