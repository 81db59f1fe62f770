package demo

import (
	"context"
	"fmt"

	"github.com/eventpipe/eventpipe/testenv/osdriver"
)

// DefaultWriterScenarios are the testenv/osdriver scenarios Config.Writers
// creates by default: the two seeds (their pulls fail only where a kubelet
// runs), the blockers the scheduler and the controller-manager write
// themselves, and a healthy sandbox.
var DefaultWriterScenarios = []string{"img-missing", "sup-bad", "pvc-unbound", "no-cpu", "taint", "selector", "healthy"}

// createSandboxes registers the node and creates the scenarios' sandboxes
// as the OpenShell driver would; the writers do the rest.
func (d *demo) createSandboxes(ctx context.Context) {
	drv, err := osdriver.New(d.cluster.AdminConfig())
	if err != nil {
		d.setPlayErr(err)
		return
	}
	if err := drv.RegisterNodes(ctx); err != nil {
		d.setPlayErr(err)
		return
	}
	for _, name := range d.cfg.Scenarios {
		sc, _, err := osdriver.Build(name, osdriver.Params{Mode: d.cfg.Mode})
		if err != nil {
			d.setPlayErr(err)
			return
		}
		s, err := drv.Run(ctx, name, osdriver.Params{Mode: d.cfg.Mode})
		if err != nil {
			if ctx.Err() == nil {
				d.setPlayErr(err)
			}
			return
		}
		what := sc.Writers
		if sc.NeedsKubelet {
			what += "; no kubelet runs here yet, so it stops at Scheduled"
		}
		d.mu.Lock()
		d.played = append(d.played, fmt.Sprintf("%s: %s (%s, id %s; written by %s)", name, sc.Description, s.Namespace(), s.ID, what))
		d.mu.Unlock()
	}
	d.mu.Lock()
	d.playDone = true
	d.mu.Unlock()
}
