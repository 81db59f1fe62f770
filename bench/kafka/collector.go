package main

import (
	"errors"

	"github.com/eventpipe/eventpipe/collector/backbone"
)

// startCollector runs a real collector in Kafka mode; it needs the
// collector's log: kafka switch (kafka-write).
func startCollector(backbone.Config, options, int) (replica, func(), error) {
	return nil, nil, errors.New("-target collector needs the collector's log: kafka switch; use -target writer")
}
