package kwire_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"

	"github.com/eventpipe/eventpipe/agent/internal/kwire"
)

// A protobuf watch of core/v1 Events read with plain HTTP: frames, the
// WatchEvent, then the object by type. (hc is authenticated, e.g. by
// rest.HTTPClientFor.)
func Example_watchEvents() {
	var hc *http.Client
	var host, rv string
	if hc == nil {
		return // documentation only: there is no API server here
	}
	req, _ := http.NewRequest(http.MethodGet, host+"/api/v1/events?watch=1&allowWatchBookmarks=true&resourceVersion="+rv, nil)
	req.Header.Set("Accept", "application/vnd.kubernetes.protobuf")
	resp, err := hc.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		if _, kind, raw, err := kwire.Unwrap(b); err == nil && kind == "Status" {
			s, _ := kwire.DecodeStatus(raw)
			fmt.Println("watch refused:", s.Code, s.Reason, s.Expired())
		}
		return
	}
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	var buf []byte
	var ev kwire.Event // reused: DecodeEvent overwrites it
	for {
		frame, err := kwire.ReadFrame(r, buf, 16<<20)
		if err != nil {
			return // io.EOF: the server ended the watch; resume from rv
		}
		buf = frame
		typ, obj, err := kwire.DecodeWatchEvent(frame)
		if err != nil {
			return
		}
		switch typ {
		case "ADDED", "MODIFIED", "DELETED":
			if err := kwire.DecodeEvent(obj, &ev); err != nil {
				continue // count and log it: bad input is never fatal
			}
			rv = ev.ResourceVersion
			fmt.Println(typ, ev.Namespace, ev.Name, ev.Reason, ev.Event.Count, ev.SeriesCount)
		case "BOOKMARK":
			rv, _, _ = kwire.BookmarkInfo(obj)
		case "ERROR":
			s, err := kwire.DecodeStatus(obj)
			if err == nil && s.Expired() {
				return // relist
			}
			return
		}
	}
}
