package diagnosis

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Every string below may come from the cluster (untrusted): clean keeps it
// on one line and out of the terminal's control.
func clean(s string) string {
	ok := true
	for _, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' || r == '\t' || r == '\r':
			b.WriteByte(' ')
		case unicode.IsControl(r) || r == utf8.RuneError:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Ago renders how long ago t was, coarsely ("12s", "4m10s", "2h5m", "3d").
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}

// DispositionText explains a disposition in words.
func DispositionText(disp string) string {
	switch disp {
	case eventpipev1.DispositionPersistent:
		return "persistent: retrying will not fix it"
	case eventpipev1.DispositionRetrying:
		return "retrying: the kubelet keeps trying, it may clear on its own"
	}
	return clean(disp)
}

func roleWord(role string) string {
	if role == "" {
		return eventpipev1.ImageRoleUnknown
	}
	return clean(role)
}

// WriteText writes one sandbox's diagnosis for a person.
func WriteText(w io.Writer, d Diagnosis, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s  workspace %s  id %s", clean(d.DisplayName()), orDash(d.Workspace), clean(d.ID))
	if d.GatewayID != "" {
		fmt.Fprintf(&b, "  gateway %s", clean(d.GatewayID))
	}
	b.WriteByte('\n')
	if !d.Live() {
		writeGone(&b, d, now)
	} else if !d.Blocked() {
		b.WriteString("nothing blocks it")
		if d.Last != nil {
			fmt.Fprintf(&b, ": last event %s %s", clean(d.Last.Reason), clean(d.Last.Object))
			if d.Last.Container != "" {
				fmt.Fprintf(&b, " (%s)", clean(d.Last.Container))
			}
			fmt.Fprintf(&b, " %s ago", Ago(now, d.Last.Time))
		}
		if d.Progress != "" {
			fmt.Fprintf(&b, "; progress %s", clean(d.Progress))
		}
		b.WriteByte('\n')
	} else {
		n, pulls := len(d.Blockers), 0
		for _, bl := range d.Blockers {
			if bl.Kind == KindImagePull {
				pulls++
			}
		}
		if pulls == n {
			fmt.Fprintf(&b, "BLOCKED by %d image pull failure%s:\n", n, plural(n))
		} else {
			fmt.Fprintf(&b, "BLOCKED by %d blocker%s:\n", n, plural(n))
		}
		for _, bl := range d.Blockers {
			writeBlocker(&b, bl, now)
		}
	}
	if d.DroppedBlockers > 0 {
		fmt.Fprintf(&b, "note: %d further blockers were not kept (more than %d per sandbox)\n", d.DroppedBlockers, maxBlockersPerSandbox)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeGone says that a sandbox was deleted or replaced, and what blocked
// it then: history, not the state of the sandbox that now has its name.
func writeGone(b *strings.Builder, d Diagnosis, now time.Time) {
	if d.DeletedAt != nil {
		fmt.Fprintf(b, "DELETED at %s (%s ago)", d.DeletedAt.UTC().Format(time.RFC3339), Ago(now, *d.DeletedAt))
	} else {
		b.WriteString("REPLACED (its deletion was not seen)")
	}
	if d.ReplacedBy != "" {
		fmt.Fprintf(b, "; the name %s is now sandbox id %s", clean(d.DisplayName()), clean(d.ReplacedBy))
	}
	b.WriteByte('\n')
	if len(d.Blockers) == 0 {
		return
	}
	fmt.Fprintf(b, "what blocked it when last seen (%d):\n", len(d.Blockers))
	for _, bl := range d.Blockers {
		writeBlocker(b, bl, now)
	}
}

func writeBlocker(b *strings.Builder, bl Blocker, now time.Time) {
	if bl.Kind == KindImagePull {
		fmt.Fprintf(b, "  %s image %s: %s%s\n", roleWord(bl.ImageRole), clean(bl.Image), clean(bl.Cause), decision(bl))
	} else {
		fmt.Fprintf(b, "  %s: %s", orDash(bl.Kind), orDash(bl.Cause))
		if bl.Object != "" {
			fmt.Fprintf(b, " (%s)", clean(bl.Object))
		}
		b.WriteString(decision(bl))
		b.WriteByte('\n')
	}
	where := []string{}
	if bl.Involved != "" {
		where = append(where, clean(bl.Namespace)+"/"+clean(bl.Involved))
	}
	if bl.Pod != "" {
		where = append(where, "pod "+clean(bl.Namespace)+"/"+clean(bl.Pod))
	}
	if bl.Container != "" {
		where = append(where, "container "+clean(bl.Container))
	}
	if bl.Node != "" {
		where = append(where, "node "+clean(bl.Node))
	}
	if len(where) > 0 {
		fmt.Fprintf(b, "    %s\n", strings.Join(where, ", "))
	}
	fmt.Fprintf(b, "    %d attempt%s since %s (%s ago), %s\n", bl.Attempts, plural(int(bl.Attempts)),
		bl.Since.UTC().Format(time.RFC3339), Ago(now, bl.Since), DispositionText(bl.Disposition))
	if bl.ExitCode != nil {
		fmt.Fprintf(b, "    last exit code %d\n", *bl.ExitCode)
	}
	if bl.Detail != "" {
		word := "runtime"
		if bl.Kind != KindImagePull {
			word = "detail"
		}
		fmt.Fprintf(b, "    %s: %s\n", word, clean(bl.Detail))
	}
	if v := bl.Verified; v != nil {
		how := "inconclusive, the runtime's words stand"
		if v.DecidedBy != "" {
			how = "verified, " + v.Confidence
		}
		who := "with your registry credentials"
		if v.Anonymous {
			who = "anonymously"
		}
		fmt.Fprintf(b, "    registry (%s, asked %s): %s: %s\n", how, who, clean(v.Answer), clean(v.Detail))
	}
	fmt.Fprintf(b, "    fix: %s\n", clean(remedyText(bl)))
}

// decision says how the cause was decided and how sure it is, as
// " [text rule, certain]" (empty when the occurrence did not say).
func decision(bl Blocker) string {
	if bl.DecidedBy == "" && bl.Confidence == "" {
		return ""
	}
	return " [" + strings.Join(nonEmpty(strings.ReplaceAll(clean(bl.DecidedBy), "_", " "), clean(bl.Confidence)), ", ") + "]"
}

func nonEmpty(s ...string) []string {
	out := s[:0]
	for _, v := range s {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

// unsure marks a cause in the table that is not certain: " (likely)".
func unsure(bl Blocker) string {
	if bl.Confidence == "" || bl.Confidence == eventpipev1.ConfidenceCertain {
		return ""
	}
	return " (" + clean(bl.Confidence) + ")"
}

// remedyText is the fix line's text: an unrecognised blocker has none.
func remedyText(bl Blocker) string {
	if bl.Remedy == "" && bl.Cause == eventpipev1.BlockerUnrecognised {
		return "none: eventpipe does not recognise the cause; the runtime's words are above"
	}
	return bl.Remedy
}

// WriteTable writes one line per sandbox when clear, one per blocker when
// blocked (BLOCKER: the image role for an image pull, else the blocker kind;
// WHAT: the image, else the object the cause names and the container) and,
// below, the fix of every blocker. A name that several sandboxes of ds had
// (a sandbox deleted and created again) is shown with each one's id; a
// deleted or replaced sandbox gets one line (STATE deleted or replaced,
// SINCE its deletion) and no fix.
func WriteTable(w io.Writer, ds []Diagnosis, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tWORKSPACE\tSTATE\tBLOCKER\tWHAT\tCAUSE\tATTEMPTS\tSINCE\tDISPOSITION")
	names := tableNames(ds)
	for i, d := range ds {
		if !d.Live() {
			since := "-"
			if d.DeletedAt != nil {
				since = Ago(now, *d.DeletedAt) + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t%s\t-\n", names[i], orDash(d.Workspace), d.State, since)
			continue
		}
		if !d.Blocked() {
			last := "-"
			if d.Last != nil {
				last = clean(d.Last.Reason)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\t(last: %s)\n", names[i], orDash(d.Workspace), "clear", last)
			continue
		}
		for j, bl := range d.Blockers {
			name, ws, state := names[i], orDash(d.Workspace), "BLOCKED"
			if j > 0 {
				name, ws, state = "", "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s ago\t%s\n", name, ws, state, blockerWord(bl),
				what(bl), clean(bl.Cause)+unsure(bl), bl.Attempts, Ago(now, bl.Since), orDash(bl.Disposition))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for i, d := range ds {
		if !d.Live() {
			continue
		}
		// Two blockers of one sandbox can need the same fix (the workload
		// and the supervisor pod meeting the same taint): one line says it.
		seen := map[string]bool{}
		for _, bl := range d.Blockers {
			line := fmt.Sprintf("fix %s (%s): %s\n", names[i], fixLabel(bl), clean(remedyText(bl)))
			if !seen[line] {
				seen[line] = true
				b.WriteString(line)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// tableNames is the SANDBOX column of each of ds: its name, and its id
// when another sandbox of ds has the same name in the same workspace.
func tableNames(ds []Diagnosis) []string {
	type key struct{ workspace, name string }
	n := map[key]int{}
	for _, d := range ds {
		n[key{d.Workspace, d.DisplayName()}]++
	}
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = clean(d.DisplayName())
		if n[key{d.Workspace, d.DisplayName()}] > 1 {
			out[i] += " (id " + clean(d.ID) + ")"
		}
	}
	return out
}

// WriteSupervisor writes the supervisor-image failures of a gateway.
func WriteSupervisor(w io.Writer, gs []SupervisorFailure, now time.Time) error {
	var b strings.Builder
	if len(gs) == 0 {
		b.WriteString("no supervisor image fails to pull\n")
	}
	for _, g := range gs {
		names := make([]string, 0, len(g.Sandboxes))
		for _, s := range g.Sandboxes {
			n := s.Name
			if n == "" {
				n = s.ID
			}
			if s.Workspace != "" {
				n = s.Workspace + "/" + n
			}
			names = append(names, clean(n))
		}
		gw := ""
		if g.GatewayID != "" {
			gw = " of gateway " + clean(g.GatewayID)
		}
		fmt.Fprintf(&b, "supervisor image %s%s: %s\n", clean(g.Image), gw, clean(g.Cause))
		if len(names) == 0 {
			b.WriteString("  blocks no sandbox yet: every new sandbox will fail on it\n")
		} else {
			fmt.Fprintf(&b, "  blocks %d sandbox%s: %s\n", len(names), pluralES(len(names)), strings.Join(names, ", "))
			fmt.Fprintf(&b, "  %d attempt%s since %s (%s ago), %s\n", g.Attempts, plural(int(g.Attempts)),
				g.Since.UTC().Format(time.RFC3339), Ago(now, g.Since), DispositionText(g.Disposition))
			if g.Detail != "" {
				fmt.Fprintf(&b, "  runtime: %s\n", clean(g.Detail))
			}
		}
		if v := g.Verified; v != nil {
			fmt.Fprintf(&b, "  registry (verified %s ago, set on %s): %s\n", Ago(now, v.CheckedAt), clean(v.Workload), clean(v.Detail))
		}
		fmt.Fprintf(&b, "  fix: %s\n", clean(g.Remedy))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// blockerWord is the BLOCKER column: whose image, or the blocker kind.
func blockerWord(bl Blocker) string {
	if bl.Kind == KindImagePull {
		return roleWord(bl.ImageRole)
	}
	return orDash(bl.Kind)
}

// what is the WHAT column: the image, or the object and the container.
func what(bl Blocker) string {
	if bl.Kind == KindImagePull {
		return orDash(bl.Image)
	}
	w := bl.Object
	if w == "" {
		w = bl.Involved
	}
	if bl.Container != "" {
		if w != "" {
			w += " "
		}
		w += "container " + bl.Container
	}
	if bl.ExitCode != nil {
		w += " exit " + strconv.Itoa(int(*bl.ExitCode))
	}
	return orDash(w)
}

// fixLabel names the blocker on a fix line.
func fixLabel(bl Blocker) string {
	switch {
	case bl.Kind == KindImagePull:
		return roleWord(bl.ImageRole) + " image"
	case bl.Container != "":
		return clean(bl.Kind) + ", container " + clean(bl.Container)
	}
	return clean(bl.Kind)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return clean(s)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func pluralES(n int) string {
	if n == 1 {
		return ""
	}
	return "es"
}
