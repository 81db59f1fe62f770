// Package config holds the rules every eventpipe YAML configuration shares
// (the collector's, the agent's, and the sink sections inside the
// collector's), so a setting means the same thing wherever it is written.
//
// Durations: a key whose Go type is time.Duration takes a string with a
// unit: "250ms", "30s", "5m", "1h30m", and, as an extension of Go's
// syntax, a leading number of days: "7d", "1d12h" (a day is 24h; eventpipe
// has no calendar arithmetic). A bare number is refused, because the YAML
// libraries would read it as nanoseconds ("retention.max_age: 604800" would
// be 0.6 ms, not a week); 0 is the one bare number accepted, as it means the
// same in every unit. NormalizeDurations applies these rules to a document
// before it is decoded, and names every offending key by its YAML path.
//
// Addresses: ListenAddr and DialAddr check a host:port the way the
// listener and the dialer will read it, without touching the network:
// a port is a number in 0-65535 (1-65535 to dial) or a service name the
// local services database knows, a host is empty (listen only), an IP
// literal, or a syntactically valid DNS name; an all-numeric dotted host
// must be a valid IPv4 address ("256.1.1.1" is neither an address nor a
// name anyone can register).
package config
