package kwire

import (
	"errors"
	"strconv"
)

// Wire types of the protobuf encoding.
const (
	wireVarint     = 0
	wireFixed64    = 1
	wireBytes      = 2
	wireStartGroup = 3
	wireEndGroup   = 4
	wireFixed32    = 5
)

var (
	errTruncated = errors.New("truncated")
	errOverflow  = errors.New("varint overflow")
	errLength    = errors.New("invalid length")
)

// Error is a decoding failure: what was being decoded (a path such as
// "Pod.spec.containers[2]") and why. Decoders return it for malformed
// input; they never panic.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return "kwire: " + e.Msg
	}
	return "kwire: " + e.Path + ": " + e.Msg
}

// at prefixes err's path with elem (the path is built on the error path
// only, so decoding allocates nothing for it).
func at(err error, elem string) error {
	var e *Error
	if errors.As(err, &e) {
		switch {
		case e.Path == "":
			e.Path = elem
		case e.Path[0] == '[':
			e.Path = elem + e.Path
		default:
			e.Path = elem + "." + e.Path
		}
		return e
	}
	return &Error{Path: elem, Msg: err.Error()}
}

// atIndex prefixes err's path with elem[i].
func atIndex(err error, elem string, i int) error {
	return at(err, elem+"["+strconv.Itoa(i)+"]")
}

func wrongType(f *fields) error {
	return &Error{Msg: "field " + strconv.Itoa(int(f.num)) + ": wrong wire type " + strconv.Itoa(int(f.typ))}
}

// varint decodes a base-128 varint at b[i:] like the gogo-generated
// Kubernetes decoders do: at most 10 bytes, bits past 64 dropped.
func varint(b []byte, i int) (uint64, int, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, i, errOverflow
		}
		if i >= len(b) {
			return 0, i, errTruncated
		}
		c := b[i]
		i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, i, nil
		}
	}
}

// fields iterates over the fields of one protobuf message. After next
// returns true, num and typ are the field's number and wire type, v holds a
// varint or fixed value and val a length-delimited value (a sub-slice of
// the message: no copy). Groups are skipped. After next returns false, err
// says why (nil at the end of the message).
type fields struct {
	b   []byte
	i   int
	num int32
	typ int8
	v   uint64
	val []byte
	err error
}

func newFields(b []byte) fields { return fields{b: b} }

func (f *fields) fail(err error) bool {
	f.err = &Error{Msg: err.Error()}
	return false
}

func (f *fields) next() bool {
	for {
		if f.i >= len(f.b) || f.err != nil {
			return false
		}
		var key uint64
		if c := f.b[f.i]; c < 0x80 { // one-byte tags are the rule
			key = uint64(c)
			f.i++
		} else {
			k, i, err := varint(f.b, f.i)
			if err != nil {
				return f.fail(err)
			}
			key, f.i = k, i
		}
		// The field number is truncated to int32 as the generated decoders do.
		num, typ := int32(key>>3), int8(key&7)
		if num <= 0 {
			return f.fail(errors.New("illegal tag " + strconv.FormatUint(key, 10)))
		}
		f.num, f.typ, f.val, f.v = num, typ, nil, 0
		switch typ {
		case wireVarint:
			v, i, err := varint(f.b, f.i)
			if err != nil {
				return f.fail(err)
			}
			f.v, f.i = v, i
		case wireFixed64:
			if len(f.b)-f.i < 8 {
				return f.fail(errTruncated)
			}
			for k := 7; k >= 0; k-- {
				f.v = f.v<<8 | uint64(f.b[f.i+k])
			}
			f.i += 8
		case wireFixed32:
			if len(f.b)-f.i < 4 {
				return f.fail(errTruncated)
			}
			for k := 3; k >= 0; k-- {
				f.v = f.v<<8 | uint64(f.b[f.i+k])
			}
			f.i += 4
		case wireBytes:
			var n uint64
			i := f.i
			if i < len(f.b) && f.b[i] < 0x80 {
				n = uint64(f.b[i])
				i++
			} else {
				var err error
				if n, i, err = varint(f.b, i); err != nil {
					return f.fail(err)
				}
			}
			if n > uint64(len(f.b)-i) {
				if int64(n) < 0 {
					return f.fail(errLength)
				}
				return f.fail(errTruncated)
			}
			f.val = f.b[i : i+int(n)]
			f.i = i + int(n)
		case wireStartGroup:
			if err := f.skipGroup(); err != nil {
				return f.fail(err)
			}
			continue // groups carry nothing Kubernetes uses
		case wireEndGroup:
			return f.fail(errors.New("end group without a start"))
		default:
			return f.fail(errors.New("illegal wire type " + strconv.Itoa(int(typ))))
		}
		return true
	}
}

// skipGroup skips to the end of the group whose start tag was just read.
func (f *fields) skipGroup() error {
	depth := 1
	for depth > 0 {
		key, i, err := varint(f.b, f.i)
		if err != nil {
			return err
		}
		f.i = i
		switch key & 7 {
		case wireVarint:
			if _, f.i, err = varint(f.b, f.i); err != nil {
				return err
			}
		case wireFixed64:
			if len(f.b)-f.i < 8 {
				return errTruncated
			}
			f.i += 8
		case wireFixed32:
			if len(f.b)-f.i < 4 {
				return errTruncated
			}
			f.i += 4
		case wireBytes:
			n, i, err := varint(f.b, f.i)
			if err != nil {
				return err
			}
			if n > uint64(len(f.b)-i) {
				return errTruncated
			}
			f.i = i + int(n)
		case wireStartGroup:
			depth++
		case wireEndGroup:
			depth--
		default:
			return errors.New("illegal wire type " + strconv.FormatUint(key&7, 10))
		}
	}
	return nil
}

// bytesField checks that the current field is length-delimited.
func (f *fields) bytesField() ([]byte, error) {
	if f.typ != wireBytes {
		return nil, wrongType(f)
	}
	return f.val, nil
}

// varintField checks that the current field is a varint.
func (f *fields) varintField() (uint64, error) {
	if f.typ != wireVarint {
		return 0, wrongType(f)
	}
	return f.v, nil
}
