//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// erringFollow is a Follow server that answers every call with one error.
type erringFollow struct {
	eventpipev1.UnimplementedFollowServer
	err error
}

func (s erringFollow) Follow(*eventpipev1.FollowRequest, eventpipev1.Follow_FollowServer) error {
	return s.err
}

// TestCollectorErrorsExitStatus: an error the collector answers with gets
// the table's status in diagnose and follow --no-follow alike (diagnose
// --watch and follow without it resubscribe instead);
// only a request the collector calls invalid is a usage error (2), and an
// error of its own is 6, never 2 ("fix your flags") nor 1 (diagnose's
// "blocked").
func TestCollectorErrorsExitStatus(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		code codes.Code
		want int
	}{
		{codes.Internal, exitError},
		{codes.Unimplemented, exitError},
		{codes.ResourceExhausted, exitError},
		{codes.FailedPrecondition, exitError},
		{codes.Unknown, exitError},
		{codes.InvalidArgument, exitUsage},
		{codes.OutOfRange, exitUsage},
		{codes.Unauthenticated, exitRefused},
		{codes.PermissionDenied, exitRefused},
		{codes.Unavailable, exitUnreachable},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			eventpipev1.RegisterFollowServer(gs, erringFollow{err: status.Error(tc.code, "the collector's own words")})
			go gs.Serve(lis)
			defer gs.Stop()
			conn := []string{"--collector", lis.Addr().String(), "--insecure", "--timeout", "20s"}
			runs := map[string][]string{
				"diagnose": append([]string{"diagnose", "some-sandbox", "-w", "ws"}, conn...),
				"follow":   {"follow", "--collector", lis.Addr().String(), "--insecure", "--workspace", "ws", "--name", "some-sandbox", "--no-follow"},
			}
			for name, args := range runs {
				var out, errb bytes.Buffer
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				got := commands[args[0]].run(ctx, args[1:], strings.NewReader(""), &out, &errb)
				cancel()
				if got != tc.want {
					t.Errorf("%s: exit %d, want %d; stderr:\n%s", name, got, tc.want, errb.String())
				}
			}
		})
	}
}
