package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Record envelope (FORMAT.md): version, stored-at, kind, payload.
const (
	recordVersion    = 1
	envelopeSize     = 1 + 8 + 1
	kindOccurrence   = 1
	kindCheckpoint   = 2
	maxOccurrenceLen = 4 << 20
)

var errBadRecord = errors.New("bad record")

func appendEnvelope(dst []byte, storedAt time.Time, kind byte) []byte {
	var h [envelopeSize]byte
	h[0] = recordVersion
	binary.LittleEndian.PutUint64(h[1:9], uint64(storedAt.UnixNano()))
	h[9] = kind
	return append(dst, h[:]...)
}

// setStoredAt overwrites the stored-at time of an encoded record.
func setStoredAt(rec []byte, t time.Time) {
	binary.LittleEndian.PutUint64(rec[1:9], uint64(t.UnixNano()))
}

// decodeEnvelope returns stored-at, kind and payload.
func decodeEnvelope(b []byte) (time.Time, byte, []byte, error) {
	if len(b) < envelopeSize {
		return time.Time{}, 0, nil, fmt.Errorf("%w: %d bytes, shorter than the envelope", errBadRecord, len(b))
	}
	if b[0] != recordVersion {
		return time.Time{}, 0, nil, fmt.Errorf("%w: unknown record version %d", errBadRecord, b[0])
	}
	t := time.Unix(0, int64(binary.LittleEndian.Uint64(b[1:9])))
	return t, b[9], b[envelopeSize:], nil
}
