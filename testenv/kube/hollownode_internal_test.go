package kube

import (
	"strings"
	"testing"
)

// A node directory too long for the kubelet's unix sockets is refused by
// AddNode with a message naming it: the kubelet itself only logs "bind:
// invalid argument" and exits (seen with make run's test under a long
// t.TempDir()).
func TestCheckNodeDir(t *testing.T) {
	for _, tc := range []struct {
		name, dir string
		ok        bool
	}{
		{"make run's default", "/tmp/eventpipe-run-864740445/cluster/attempt-1/nodes/node-1", true},
		{"at the limit", "/" + strings.Repeat("d", maxNodeDir-1), true},
		{"the failing test's", "/tmp/TestMakeRunWritersmanaged2102769999/001/data/cluster/attempt-1/nodes/node-1", false},
	} {
		err := checkNodeDir(tc.dir)
		if (err == nil) != tc.ok {
			t.Errorf("%s (%d bytes): err = %v, want ok=%v", tc.name, len(tc.dir), err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tc.dir) {
			t.Errorf("%s: error %q does not name the directory", tc.name, err)
		}
	}
}
