package gateway

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// watch relays one WatchSandboxes stream: the driver's messages in order
// (snapshots patched, its own kubernetes platform events dropped when
// configured), with eventpipe's platform events spliced in between: first
// the tail not yet sent on this connection, then live ones. One goroutine
// sends, so the gateway sees whole messages in a single order.
func (p *Proxy) watch(ctx context.Context, ss grpc.ServerStream, up grpc.ClientStream, connID uint64) error {
	sub, tail := p.hub.subscribe(connID)
	defer p.hub.unsubscribe(sub)
	p.metrics.streams.Inc()
	defer p.metrics.streams.Dec()

	type result struct {
		b   []byte
		err error
	}
	driverCh := make(chan result, 16)
	go func() {
		for {
			var f frame
			err := up.RecvMsg(&f)
			select {
			case driverCh <- result{f.bytes(), err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	send := func(e *entry) error {
		if !p.hub.claim(sub, e) {
			return nil
		}
		if err := ss.SendMsg(&frame{b: e.msg}); err != nil {
			p.hub.unclaim(sub, e)
			return err
		}
		p.metrics.spliced.Inc()
		return nil
	}
	p.persistUpTo(tail)
	for len(tail) > 0 {
		// Driver messages are not held back behind a long tail.
		select {
		case r := <-driverCh:
			if done, err := p.relayWatch(ss, r.b, r.err); done {
				return err
			}
			continue
		default:
		}
		if err := send(tail[0]); err != nil {
			return err
		}
		tail = tail[1:]
	}
	for {
		select {
		case r := <-driverCh:
			if done, err := p.relayWatch(ss, r.b, r.err); done {
				return err
			}
		case <-sub.notify:
			for {
				batch, overrun := p.hub.read(sub, 256)
				if overrun {
					// This stream fell more than follow.max_events behind:
					// send what the tails still hold that this connection
					// has not had.
					p.log.Warn("WatchSandboxes stream fell behind the proxy's event log; catching up from the per-sandbox tails (older events of busy sandboxes may be missing)",
						"max_events", p.cfg.Follow.MaxEvents)
					batch = append(p.hub.pending(sub), batch...)
				}
				p.persistUpTo(batch)
				for _, e := range batch {
					select {
					case r := <-driverCh:
						if done, err := p.relayWatch(ss, r.b, r.err); done {
							return err
						}
					default:
					}
					if err := send(e); err != nil {
						return err
					}
				}
				if len(batch) < 256 {
					break
				}
			}
		case <-p.stopping:
			return status.Error(codes.Unavailable, "eventpipe driver-proxy is shutting down; reconnect")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// relayWatch forwards one driver message; done reports the end of the
// stream with its status.
func (p *Proxy) relayWatch(ss grpc.ServerStream, b []byte, rerr error) (done bool, err error) {
	if rerr != nil {
		if errors.Is(rerr, io.EOF) {
			return true, nil
		}
		return true, rerr
	}
	ev, perr := driverwire.ParseWatchEvent(b)
	if perr != nil {
		p.metrics.malformed.Inc()
		p.log.Warn("WatchSandboxes message not edited: cannot parse it; forwarded unchanged", "err", perr)
		return false, ss.SendMsg(&frame{b: b})
	}
	switch ev.Kind {
	case driverwire.KindPlatform:
		if p.cfg.DropDriverKubernetesEvents && ev.Source == SourceKubernetes && p.hub.replacing() {
			p.metrics.droppedDriverEvents.Inc()
			return false, nil
		}
	case driverwire.KindSandbox:
		b = p.edit(b, driverwire.PatchWatchEvent)
	case driverwire.KindDeleted:
		p.hub.forget(ev.SandboxID)
	}
	return false, ss.SendMsg(&frame{b: b})
}
