package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
)

// listenUnix creates the proxy's socket the way the OpenShell driver
// creates its own: the directory belongs to our uid and is 0700 (created
// so when missing, forced to 0700 when ours with other bits, refused when
// another uid owns it), a stale socket file is replaced, the socket is 0600.
func listenUnix(path string, log *slog.Logger) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	uid := os.Geteuid()
	st, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create socket directory %s: %w", dir, err)
		}
		if st, err = os.Lstat(dir); err != nil {
			return nil, fmt.Errorf("socket directory %s: %w", dir, err)
		}
	case err != nil:
		return nil, fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("socket directory %s is not a directory (%s)", dir, st.Mode().Type())
	}
	owner := -1
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		owner = int(sys.Uid)
	}
	if owner != uid {
		return nil, fmt.Errorf("socket directory %s is owned by uid %d, not by this process's uid %d: refusing to listen there (any user who owns it could replace the socket); use a directory owned by uid %d, or run the proxy as uid %d like the gateway and the driver", dir, owner, uid, uid, owner)
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("socket directory %s has mode %04o and cannot be made 0700: %w", dir, st.Mode().Perm(), err)
		}
		log.Warn("socket directory mode forced to 0700", "dir", dir, "was", fmt.Sprintf("%04o", st.Mode().Perm()))
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listen %s: a %s is in the way (not a socket); remove it", path, fi.Mode().Type())
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return l, nil
}

// peerListener accepts only peers with our uid (SO_PEERCRED) and gives
// every accepted connection its own id, which the proxy uses to tell one
// gateway connection from the next.
type peerListener struct {
	*net.UnixListener
	uid      int
	log      *slog.Logger
	rejected func()
	nextID   atomic.Uint64
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.UnixListener.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uid, pid, err := peerCred(c)
		if err != nil {
			l.log.Warn("connection refused: cannot read peer credentials", "err", err)
			l.rejected()
			c.Close()
			continue
		}
		if uid != l.uid {
			l.log.Warn("connection refused: peer runs as another uid", "peer_uid", uid, "peer_pid", pid, "want_uid", l.uid)
			l.rejected()
			c.Close()
			continue
		}
		return &idConn{UnixConn: c, id: l.nextID.Add(1)}, nil
	}
}

func peerCred(c *net.UnixConn) (uid, pid int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if serr != nil {
		return 0, 0, serr
	}
	return int(cred.Uid), int(cred.Pid), nil
}

// idConn names its connection in RemoteAddr, which gRPC hands to handlers
// as the peer address.
type idConn struct {
	*net.UnixConn
	id uint64
}

func (c *idConn) RemoteAddr() net.Addr { return connAddr(c.id) }

type connAddr uint64

func (a connAddr) Network() string { return "unix" }
func (a connAddr) String() string  { return fmt.Sprintf("gateway-conn-%d", uint64(a)) }
