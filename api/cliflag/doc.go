// Package cliflag holds the few flag helpers every eventpipe command shares,
// so that one spelling of each concept (--ca, --token-file, --insecure,
// --gateway, -o text) is the only one a user has to learn, while command
// lines written for an older spelling keep working and say what to write
// instead.
package cliflag
