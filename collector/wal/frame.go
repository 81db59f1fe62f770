package wal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Segment and frame layout (FORMAT.md). Version 2 frames carry their offset
// and a round-start flag; version 1 segments (offset = position) are still
// read, never written. Version 4 segments hold version 2 frames; their
// header says that the segment before them ends exactly where they start
// (a repair's gap of offsets is a gap segment of its own, flagGap), so a
// sealed segment found shorter than that lost its tail. Version 3 is never
// used: it is one bit from both 1 and 2, and the header check relies on
// the versions differing in at least two bits.
const (
	headerSize    = 16
	formatV1      = 1
	formatV2      = 2
	formatV4      = 4
	formatVersion = formatV4
	// flagGap (header byte 5, version 4 only) marks a gap segment: it holds
	// no frame, and the offsets from its first to the next segment's first
	// were skipped on purpose by a repair. 'G' is four bits away from 0, so
	// a flipped bit never makes or unmakes a gap segment.
	flagGap       byte = 'G'
	frameHeaderV1      = 8
	frameHeaderV2      = 16
	// flagRoundStart (bit 31 of the length word) marks the first frame a
	// write wrote into a segment after the segment's last fsync: every frame
	// before it was durable before it was written.
	flagRoundStart uint32 = 1 << 31
	lengthMask     uint32 = flagRoundStart - 1
	// minFrameV2 is the smallest v2 frame (a 1-byte record).
	minFrameV2 = frameHeaderV2 + 1
)

// frameVersion is the frame layout a segment of format version ver holds.
func frameVersion(ver byte) byte {
	if ver == formatV1 {
		return formatV1
	}
	return formatV2
}

func frameHeaderSize(ver byte) int {
	if ver == formatV1 {
		return frameHeaderV1
	}
	return frameHeaderV2
}

// appendFrame appends one version 2 frame.
func appendFrame(dst []byte, off uint64, rec []byte, roundStart bool) []byte {
	var h [frameHeaderV2]byte
	l := uint32(len(rec))
	if roundStart {
		l |= flagRoundStart
	}
	binary.LittleEndian.PutUint32(h[0:4], l)
	binary.LittleEndian.PutUint64(h[8:16], off)
	binary.LittleEndian.PutUint32(h[4:8], frameCRC(h[:], rec))
	dst = append(dst, h[:]...)
	return append(dst, rec...)
}

// frameCRC is the CRC-32C of a v2 frame: length word, offset, payload.
func frameCRC(h, payload []byte) uint32 {
	crc := crc32.Checksum(h[0:4], castagnol)
	crc = crc32.Update(crc, castagnol, h[8:16])
	return crc32.Update(crc, castagnol, payload)
}

// frame describes one intact frame.
type frame struct {
	off        uint64
	roundStart bool
	size       int // header and payload
}

// parseFrame checks the v2 frame at the start of b (header, length,
// checksum) without copying.
func parseFrame(b []byte, maxRec int) (frame, bool) {
	if len(b) < frameHeaderV2 {
		return frame{}, false
	}
	word := binary.LittleEndian.Uint32(b[0:4])
	l := int64(word & lengthMask)
	if l == 0 || l > int64(maxRec) || int64(len(b)) < frameHeaderV2+l {
		return frame{}, false
	}
	if frameCRC(b, b[frameHeaderV2:frameHeaderV2+l]) != binary.LittleEndian.Uint32(b[4:8]) {
		return frame{}, false
	}
	return frame{off: binary.LittleEndian.Uint64(b[8:16]), roundStart: word&flagRoundStart != 0, size: frameHeaderV2 + int(l)}, true
}

// frameReader reads the frames of one segment file in order.
type frameReader struct {
	src     io.ReaderAt
	r       *bufio.Reader
	ver     byte
	pos     int64  // position of the next frame
	end     int64  // end of the readable region
	next    uint64 // version 1: offset of the next frame
	maxRec  int
	bufSize int
	hdr     [frameHeaderV2]byte
}

func newFrameReader(src io.ReaderAt, ver byte, pos, end int64, next uint64, maxRec, bufSize int) *frameReader {
	fr := &frameReader{src: src, ver: ver, end: end, next: next, maxRec: maxRec, bufSize: bufSize}
	fr.seek(pos)
	return fr
}

// seek moves to pos (a frame boundary found by a scan).
func (fr *frameReader) seek(pos int64) {
	fr.pos = pos
	n := int(min(int64(fr.bufSize), max(fr.end-pos, 4096)))
	fr.r = bufio.NewReaderSize(io.NewSectionReader(fr.src, pos, max(fr.end-pos, 0)), n)
}

// read reads the next frame's payload into *buf. It returns io.EOF at the
// end of the region, io.ErrUnexpectedEOF for a frame cut short and an error
// wrapping ErrCorrupt for a bad length or checksum. After an error the
// reader must be moved with seek before it is used again.
func (fr *frameReader) read(buf *[]byte) (frame, error) {
	hs := frameHeaderSize(fr.ver)
	h := fr.hdr[:hs]
	if n, err := io.ReadFull(fr.r, h); err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return frame{}, io.EOF
		}
		return frame{}, io.ErrUnexpectedEOF
	}
	word := binary.LittleEndian.Uint32(h[0:4])
	l := word
	if fr.ver != formatV1 {
		l &= lengthMask
	}
	if l == 0 || int64(l) > int64(fr.maxRec) {
		return frame{}, fmt.Errorf("%w: implausible length %d", ErrCorrupt, l)
	}
	if cap(*buf) < int(l) {
		*buf = make([]byte, l)
	}
	*buf = (*buf)[:l]
	if _, err := io.ReadFull(fr.r, *buf); err != nil {
		return frame{}, io.ErrUnexpectedEOF
	}
	f := frame{size: hs + int(l)}
	if fr.ver == formatV1 {
		crc := crc32.Update(crc32.Checksum(h[0:4], castagnol), castagnol, *buf)
		if crc != binary.LittleEndian.Uint32(h[4:8]) {
			return frame{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
		}
		f.off = fr.next
		fr.next++
	} else {
		if frameCRC(h, *buf) != binary.LittleEndian.Uint32(h[4:8]) {
			return frame{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
		}
		f.off = binary.LittleEndian.Uint64(h[8:16])
		f.roundStart = word&flagRoundStart != 0
	}
	fr.pos += int64(f.size)
	return f, nil
}
