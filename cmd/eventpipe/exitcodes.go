package main

import "google.golang.org/grpc/codes"

// Exit statuses every eventpipe command uses, one meaning each, so a script
// can tell "fix the command line" from "the collector is down" from "the
// collector said no" whichever command it ran. docs/cli.md has the table;
// TestExitCodeTableDocumented keeps the two in step.
const (
	exitOK          = 0 // done (diagnose: nothing blocks)
	exitFailed      = 1 // ran and failed (diagnose: something blocks)
	exitUsage       = 2 // bad flags, input or configuration
	exitNotFound    = 3 // diagnose: the collector has no events of that sandbox
	exitUnreachable = 4 // the collector cannot be reached or did not answer in time
	exitRefused     = 5 // the collector refused the credentials or the token's grants
	exitError       = 6 // the collector answered with another error, or the output could not be written
)

// exitCodes names each status as docs/cli.md does.
var exitCodes = []struct {
	code int
	name string
}{
	{exitOK, "ok"},
	{exitFailed, "failed"},
	{exitUsage, "usage"},
	{exitNotFound, "not-found"},
	{exitUnreachable, "unreachable"},
	{exitRefused, "refused"},
	{exitError, "error"},
}

// collectorExit is the status for an error the collector's gRPC API (or the
// way to it) returned, the same for every command: unreachable, refused, a
// request it calls invalid (usage), or any other error of its own (error,
// never usage: "fix your command line" would send the user the wrong way,
// and never failed: diagnose's 1 means "blocked").
func collectorExit(c codes.Code) int {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded:
		return exitUnreachable
	case codes.Unauthenticated, codes.PermissionDenied:
		return exitRefused
	case codes.InvalidArgument, codes.OutOfRange:
		// A tail above its maximum; a resume point (--after) beyond the
		// log: the command line is what to change.
		return exitUsage
	}
	return exitError
}
