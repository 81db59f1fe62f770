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
// creates its own: in a directory only our uid can write to, a stale socket
// file replaced, the socket 0600.
//
// The directory's mode is changed only when the proxy created it (0700):
// an existing directory is someone's choice and may be shared (a proxy
// started as root with --listen /tmp/x.sock must not make /tmp 0700 for
// every other user). An existing directory owned by another uid, or one
// that the group or others may write to (1777 /tmp, a 0775 directory), is
// refused with an error that names a private directory to use instead: in
// a shared directory another user could replace the socket, and a private
// subdirectory chosen by the proxy would move the socket away from the path
// the gateway dials. An existing private directory (0700, 0755, 0750) is
// used as it is.
func listenUnix(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	uid := os.Geteuid()
	st, err := os.Lstat(dir)
	created := false
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create socket directory %s: %w", dir, err)
		}
		created = true
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
	if created && st.Mode().Perm() != 0o700 {
		// Only a directory made here is tightened (the umask may have
		// left it narrower; never wider).
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("socket directory %s (created) cannot be made 0700: %w", dir, err)
		}
	}
	if !created && st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("socket directory %s is shared (mode %s): other users can write to it and could replace the socket; refusing to listen there and leaving its mode alone; use a directory of the proxy's own, e.g. --listen %s (created 0700 when missing)",
			dir, modeString(st.Mode()), filepath.Join(dir, "eventpipe-driver-proxy", filepath.Base(path)))
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

// modeString is a directory mode as chmod takes it (01777 for /tmp).
func modeString(m fs.FileMode) string {
	v := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	return fmt.Sprintf("%04o", v)
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
