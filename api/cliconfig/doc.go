// Package cliconfig is where the eventpipe client commands (follow,
// diagnose) find the collector when the command line does not say: the
// EVENTPIPE_* environment variables and a context file like kubectl's
// ($XDG_CONFIG_HOME/eventpipe/config.yaml, mode 0600), with named contexts
// and a current one.
//
// Precedence, per group of settings: a flag, then the environment, then the
// context, then the default. The groups are {collector, server-name},
// {ca, insecure} and {token-file}: the first source that sets any setting
// of a group decides the whole group, so a --insecure on the command line
// never meets a CA from the context, and a --collector never inherits
// another collector's TLS server name.
package cliconfig
