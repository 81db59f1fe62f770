package demo

import (
	"context"
	"fmt"

	"github.com/eventpipe/eventpipe/testenv/osdriver"
)

// createSandboxes creates the scenarios' sandboxes through drv as the
// OpenShell driver would; the writers and the node's kubelet do the rest.
func (d *demo) createSandboxes(ctx context.Context, drv *osdriver.Driver) {
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
		d.mu.Lock()
		d.played = append(d.played, fmt.Sprintf("%s: %s (%s, id %s; written by %s)", name, sc.Description, s.Namespace(), s.ID, sc.Writers))
		d.mu.Unlock()
	}
	d.mu.Lock()
	d.playDone = true
	d.mu.Unlock()
}
