package scenario_test

import (
	"os"
	"testing"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// One control plane for the package; every test plays into its own
// workspace so they do not collide.
var (
	cluster *kube.Cluster
	clients scenario.Clients
)

func TestMain(m *testing.M) {
	os.Exit(kube.RunTestMain(m, "scenario-test-", func(c *kube.Cluster) error {
		cluster = c
		var err error
		clients, err = scenario.NewClients(c.AdminConfig())
		return err
	}))
}
