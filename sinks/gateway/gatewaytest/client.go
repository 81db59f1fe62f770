package gatewaytest

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Client plays the gateway: it dials a driver socket (the proxy's or the
// driver's own) and calls it with raw messages, as the gateway does over
// its one channel.
type Client struct {
	conn *grpc.ClientConn
}

// Dial returns a client of the socket at path (it connects lazily). It
// accepts messages up to 64 MiB (gRPC's default, and tonic's, is 4 MiB: a
// real gateway may refuse a ListSandboxes answer this client takes). opts
// are added to the connection's (a benchmark uses them to play a gateway
// with other HTTP/2 settings).
func Dial(path string, opts ...grpc.DialOption) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+path, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20))}, opts...)...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Response is what one call returned.
type Response struct {
	Bodies          [][]byte
	Header, Trailer metadata.MD
}

// Call runs any method as a stream: it sends reqs, half-closes, and reads
// every response until the status (err: the status error, nil for OK).
func (c *Client) Call(ctx context.Context, method string, reqs ...[]byte) (Response, error) {
	st, err := c.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return Response{}, err
	}
	for _, r := range reqs {
		if err := st.SendMsg(&Bytes{r}); err != nil {
			break // the status comes from RecvMsg
		}
	}
	_ = st.CloseSend()
	var out Response
	for {
		var b Bytes
		err := st.RecvMsg(&b)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			out.Header, _ = st.Header()
			out.Trailer = st.Trailer()
			return out, err
		}
		if b.B == nil {
			b.B = []byte{}
		}
		out.Bodies = append(out.Bodies, b.B)
	}
}

// Unary calls a unary method with the ordinary unary path (grpc.Invoke).
func (c *Client) Unary(ctx context.Context, method string, req []byte) (Response, error) {
	var resp Bytes
	var out Response
	err := c.conn.Invoke(ctx, method, &Bytes{req}, &resp, grpc.Header(&out.Header), grpc.Trailer(&out.Trailer))
	if resp.B != nil {
		out.Bodies = [][]byte{resp.B}
	}
	return out, err
}

// Watch is an open WatchSandboxes stream.
type Watch struct {
	st grpc.ClientStream
}

// Watch opens WatchSandboxes (empty request).
func (c *Client) Watch(ctx context.Context) (*Watch, error) {
	st, err := c.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, MethodWatch)
	if err != nil {
		return nil, err
	}
	if err := st.SendMsg(&Bytes{[]byte{}}); err != nil {
		return nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	return &Watch{st: st}, nil
}

// RecvRaw returns the next message's bytes.
func (w *Watch) RecvRaw() ([]byte, error) {
	var b Bytes
	if err := w.st.RecvMsg(&b); err != nil {
		return nil, err
	}
	return b.B, nil
}

// Recv returns the next message, decoded.
func (w *Watch) Recv() (WatchEvent, error) {
	b, err := w.RecvRaw()
	if err != nil {
		return WatchEvent{}, err
	}
	return DecodeWatchEvent(b)
}

// Header is the stream's response header.
func (w *Watch) Header() (metadata.MD, error) { return w.st.Header() }

// WithContentSubtype makes the client send content-type
// "application/grpc+sub", or the bare "application/grpc" for "" (what
// tonic, the OpenShell gateway's gRPC stack, sends). Without it the client
// sends "application/grpc+proto".
func WithContentSubtype(sub string) grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.ForceCodec(namedCodec{name: sub}))
}

// namedCodec is rawCodec under another name (the name is the content
// subtype a gRPC client sends).
type namedCodec struct {
	rawCodec
	name string
}

func (c namedCodec) Name() string { return c.name }
