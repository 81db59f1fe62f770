// Package sinks holds what every destination shares: the Pusher contract a
// destination implements, the error classes it returns, and the Source and
// Cursor it reads through. Each destination lives in its own subpackage
// (sinks/file, sinks/loki, sinks/kafka).
//
// sinks depends only on the schema (api/eventpipe/v1). The collector's log
// implements Source and Cursor; the collector wires sinks to it. Nothing here
// imports the collector.
package sinks
