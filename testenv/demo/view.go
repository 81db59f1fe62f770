package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks/diagnosis"
)

// view shows the diagnoses until ctx ends or a component fails.
func (d *demo) view(ctx context.Context, errs <-chan error) error {
	tick := time.NewTicker(d.cfg.Refresh)
	defer tick.Stop()
	lastKey := ""
	var doneAt time.Time
	dataShown := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			d.printf("\neventpipe: %v\n", err)
			return err
		case <-d.watcher.Changed():
		case <-tick.C:
		}
		d.mu.Lock()
		playErr, done, played := d.playErr, d.playDone, append([]string(nil), d.played...)
		d.mu.Unlock()
		if playErr != nil {
			d.printf("\neventpipe: create the sandboxes: %v\n", playErr)
			return fmt.Errorf("create the sandboxes: %w", playErr)
		}
		sbs := d.watcher.Sandboxes()
		now := time.Now()
		if d.cfg.Terminal {
			var b strings.Builder
			b.WriteString("\033[H\033[2J")
			b.WriteString(d.diagText(sbs, now))
			b.WriteString("\n")
			b.WriteString(d.dataText())
			if done && len(played) > 0 {
				b.WriteString("created:\n  " + strings.Join(played, "\n  ") + "\n")
			}
			b.WriteString("Ctrl-C stops everything.\n")
			d.printf("%s", b.String())
			continue
		}
		if key := diagKey(sbs); key != lastKey {
			lastKey = key
			d.printf("%s\n", d.diagText(sbs, now))
		}
		if done && doneAt.IsZero() {
			doneAt = now
		}
		// Once the sandboxes are created and the pipeline has caught up
		// (or after a while), say where the data went.
		if !dataShown && !doneAt.IsZero() && (d.caughtUp() || now.Sub(doneAt) > 10*time.Second) {
			dataShown = true
			if len(played) > 0 {
				d.printf("created:\n  %s\n", strings.Join(played, "\n  "))
			}
			d.printf("%s(the pipeline keeps running: new events show up above; Ctrl-C stops everything)\n\n", d.dataText())
		}
	}
}

// diagKey changes when what the table shows changes (not with the clock).
func diagKey(sbs []diagnosis.Diagnosis) string {
	var b strings.Builder
	for _, s := range sbs {
		fmt.Fprintf(&b, "%s|%s|%s|%s;", s.ID, s.Name, s.State, s.Progress)
		for _, bl := range s.Blockers {
			fmt.Fprintf(&b, "%s|%s|%s|%s|%s|%s|%s|%d", bl.Kind, bl.Image, bl.ImageRole, bl.Object, bl.Container, bl.Cause, bl.Disposition, bl.Attempts)
			if bl.ExitCode != nil {
				fmt.Fprintf(&b, "|%d", *bl.ExitCode)
			}
			b.WriteByte(',')
		}
	}
	return b.String()
}

func (d *demo) diagText(sbs []diagnosis.Diagnosis, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "== %s  what `eventpipe diagnose --gateway %s` says (live, from the collector's Follow stream)\n",
		now.Format("15:04:05"), d.cfg.Gateway)
	if len(sbs) == 0 {
		b.WriteString("(no sandbox events yet)\n")
		return b.String()
	}
	_ = diagnosis.WriteTable(&b, sbs, now)
	if gs := diagnosis.Supervisor(sbs); len(gs) > 0 {
		b.WriteString("-- `eventpipe diagnose --supervisor`:\n")
		_ = diagnosis.WriteSupervisor(&b, gs, now)
	}
	if n := d.watcher.Dropped(); n > 0 {
		fmt.Fprintf(&b, "WARNING: %d events of further sandboxes not shown (view bound)\n", n)
	}
	if st := d.watcher.Status(); !st.Connected && st.LastError != "" {
		fmt.Fprintf(&b, "(follow stream down, resubscribing: %s)\n", st.LastError)
	}
	return b.String()
}

// counts is where the occurrences are, stage by stage.
type counts struct {
	agentAcked               float64
	logLast                  uint64
	sinkName                 string
	sinkSent, sinkLag        uint64
	sinkHandled              uint64
	followCursor             uint64
	collectorHTTP, agentHTTP string
}

func (d *demo) counts() counts {
	c := counts{agentAcked: counterSum(d.agentReg, "eventpipe_agent_acked_occurrences_total"),
		collectorHTTP: d.coll.HTTPAddr(), agentHTTP: d.ag.HTTPAddr(), followCursor: d.watcher.Status().Cursor}
	_, c.logLast = d.coll.Store().Bounds()
	for _, r := range d.coll.Runners() {
		st := r.Status()
		c.sinkName, c.sinkSent, c.sinkLag, c.sinkHandled = st.Name, st.Sent, st.LagRecords, st.Handled
	}
	return c
}

func (d *demo) caughtUp() bool {
	c := d.counts()
	return c.logLast > 0 && c.sinkHandled >= c.logLast && c.followCursor >= c.logLast && c.agentAcked > 0
}

func (d *demo) dataText() string { return d.dataTextFinal(false) }

// dataTextFinal is dataText; final (at shutdown) leaves out the command to
// try, whose collector is about to stop.
func (d *demo) dataTextFinal(final bool) string {
	c := d.counts()
	var b strings.Builder
	b.WriteString("where the data went:\n")
	fmt.Fprintf(&b, "  agent       %.0f occurrences acknowledged by the collector; metrics http://%s/metrics\n", c.agentAcked, c.agentHTTP)
	fmt.Fprintf(&b, "  collector   %d records in the durable log %s; metrics http://%s/metrics\n", c.logLast, filepath.Join(d.dir, "log"), c.collectorHTTP)
	fmt.Fprintf(&b, "  %-11s %d occurrences written, lag %d -> %s\n", c.sinkName+" sink", c.sinkSent, c.sinkLag, d.fileSinkPath())
	fmt.Fprintf(&b, "  follow      this view has read up to cursor %d (sandboxes of gateway %s)\n", c.followCursor, d.cfg.Gateway)
	if final {
		return b.String()
	}
	fmt.Fprintf(&b, "  try         %s diagnose --collector %s --insecure --token-file %s --supervisor\n", d.cfg.CLI, d.coll.GRPCAddr(), filepath.Join(d.dir, "reader.token"))
	return b.String()
}

// counterSum adds up every series of a counter in reg.
func counterSum(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
