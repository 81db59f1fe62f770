package config

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// PlaceholderCluster is the cluster name the shipped manifests carry until
// an operator names the cluster. The agent refuses to run with it, and the
// collector refuses to grant it: two clusters left at the placeholder would
// write into each other's cursor.
const PlaceholderCluster = "CHANGE-ME"

// IsPlaceholderToken reports whether a bearer token is one of the
// placeholders the shipped examples carry ("REPLACE-WITH-...",
// "CHANGE-ME..."): a tokens file copied without replacing them would
// publish a token anyone can read in the repository.
func IsPlaceholderToken(tok string) bool {
	up := strings.ToUpper(strings.TrimSpace(tok))
	for _, p := range []string{"REPLACE-WITH", "REPLACE_WITH", "CHANGE-ME", "CHANGEME", "CHANGE_ME"} {
		if strings.HasPrefix(up, p) {
			return true
		}
	}
	return false
}

// ListenAddr checks a host:port a TCP listener will bind: the host empty
// (every interface), an IP literal or a DNS name; the port 0-65535 (0: any
// free port) or a known service name.
func ListenAddr(addr string) error {
	return checkAddr(addr, true)
}

// DialAddr checks a host:port to connect to: the host must be set (an IP
// literal or a DNS name) and the port 1-65535 or a known service name.
func DialAddr(addr string) error {
	return checkAddr(addr, false)
}

func checkAddr(addr string, listen bool) error {
	if addr == "" {
		return fmt.Errorf("must be set (host:port)")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", addr, strings.TrimPrefix(err.Error(), "address "+addr+": "))
	}
	if err := checkPort(port, listen); err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	if host == "" {
		if !listen {
			return fmt.Errorf("%q: the host is missing", addr)
		}
		return nil
	}
	if err := checkHost(host); err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	return nil
}

func checkPort(port string, listen bool) error {
	if port == "" {
		return fmt.Errorf("the port is missing")
	}
	if allDigits(port) {
		n, err := strconv.ParseUint(port, 10, 32)
		if err != nil || n > 65535 {
			return fmt.Errorf("port %s is out of range 0-65535", port)
		}
		if n == 0 && !listen {
			return fmt.Errorf("port 0 cannot be dialled")
		}
		return nil
	}
	// A service name: resolved from the local services database, as the
	// listener and the dialer will (no network involved).
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("port %q is neither a number (0-65535) nor a known service name", port)
	}
	return nil
}

// checkHost accepts an IP literal (with an IPv6 zone) or a DNS name.
func checkHost(host string) error {
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if strings.Contains(host, ":") {
		return fmt.Errorf("host %q is not a valid IPv6 address", host)
	}
	if isNumericDotted(host) {
		return fmt.Errorf("host %q is not a valid IPv4 address", host)
	}
	if !validDNSName(host) {
		return fmt.Errorf("host %q is neither an IP address nor a valid DNS name", host)
	}
	return nil
}

// IsLoopback reports whether addr (host:port) binds or reaches only the
// local machine: a loopback IP or "localhost". An empty host (every
// interface) is not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func isNumericDotted(s string) bool {
	s = strings.TrimSuffix(s, ".")
	for _, part := range strings.Split(s, ".") {
		if !allDigits(part) {
			return false
		}
	}
	return true
}

// validDNSName: labels of letters, digits, '-' and '_' (service records),
// 1-63 characters, not starting or ending with '-', 253 characters at most,
// an optional trailing dot.
func validDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
