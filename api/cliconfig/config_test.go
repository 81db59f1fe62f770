package cliconfig

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestResolvePrecedence(t *testing.T) {
	file := &File{CurrentContext: "prod", Contexts: map[string]Context{
		"prod": {Collector: "prod:7070", CA: "/ctx/ca.pem", TokenFile: "/ctx/reader.token", ServerName: "collector.eventpipe.svc"},
		"dev":  {Collector: "127.0.0.1:7070", Insecure: true, TokenFile: "/dev/token"},
	}}
	env := map[string]string{
		"EVENTPIPE_COLLECTOR": "env:7070", "EVENTPIPE_CA": "/env/ca.pem", "EVENTPIPE_TOKEN_FILE": "/env/token",
	}
	cases := []struct {
		name    string
		flags   map[string]string
		env     map[string]string
		file    *File
		context string
		want    Settings
		err     string
	}{
		{name: "nothing set: the default", want: Settings{Collector: "default:7070"}},
		{name: "context only", file: file,
			want: Settings{Collector: "prod:7070", CA: "/ctx/ca.pem", TokenFile: "/ctx/reader.token", ServerName: "collector.eventpipe.svc"}},
		{name: "env over context", env: env, file: file,
			want: Settings{Collector: "env:7070", CA: "/env/ca.pem", TokenFile: "/env/token"}},
		{name: "flags over env and context", env: env, file: file,
			flags: map[string]string{"collector": "flag:7070", "ca": "/flag/ca.pem", "token-file": "/flag/token"},
			want:  Settings{Collector: "flag:7070", CA: "/flag/ca.pem", TokenFile: "/flag/token"}},
		{name: "flag --insecure drops the env CA (one group)", env: env, file: file,
			flags: map[string]string{"insecure": "true"},
			want:  Settings{Collector: "env:7070", TokenFile: "/env/token", Insecure: true}},
		{name: "flag --collector drops the context's server name", file: file,
			flags: map[string]string{"collector": "127.0.0.1:17070"},
			want:  Settings{Collector: "127.0.0.1:17070", CA: "/ctx/ca.pem", TokenFile: "/ctx/reader.token"}},
		{name: "flag --server-name alone: its group (with the collector) comes from flags", file: file,
			flags: map[string]string{"server-name": "x"},
			want:  Settings{Collector: "default:7070", ServerName: "x", CA: "/ctx/ca.pem", TokenFile: "/ctx/reader.token"}},
		{name: "env insecure", env: map[string]string{"EVENTPIPE_INSECURE": "true"}, file: file,
			want: Settings{Collector: "prod:7070", ServerName: "collector.eventpipe.svc", TokenFile: "/ctx/reader.token", Insecure: true}},
		{name: "--context picks another context", file: file, context: "dev",
			want: Settings{Collector: "127.0.0.1:7070", TokenFile: "/dev/token", Insecure: true}},
		{name: "unknown --context", file: file, context: "nope", err: `no context "nope" (have [dev prod])`},
		{name: "bad EVENTPIPE_INSECURE", env: map[string]string{"EVENTPIPE_INSECURE": "yes please"}, err: "EVENTPIPE_INSECURE: want true or false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(Source{Flags: tc.flags, Getenv: func(k string) string { return tc.env[k] }, File: tc.file,
				Context: tc.context, DefaultCollector: "default:7070"})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "eventpipe", "config.yaml")
	f, err := Load(path)
	if err != nil || len(f.Contexts) != 0 {
		t.Fatalf("missing file: %+v %v", f, err)
	}
	f.Contexts = map[string]Context{"kind": {Collector: "127.0.0.1:7070", CA: "/tmp/ca.pem", TokenFile: "/tmp/t"}}
	f.CurrentContext = "kind"
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600 (%v)", st.Mode(), err)
	}
	back, err := Load(path)
	if err != nil || !reflect.DeepEqual(back, f) {
		t.Fatalf("read back %+v %v, want %+v", back, err, f)
	}
	if err := os.WriteFile(path, []byte("current-context: gone\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), `current-context "gone"`) {
		t.Fatalf("dangling current-context: %v", err)
	}
}

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"XDG_CONFIG_HOME": "/x", "HOME": "/h"}, "/x/eventpipe/config.yaml"},
		{map[string]string{"HOME": "/h"}, "/h/.config/eventpipe/config.yaml"},
	} {
		if got, err := Path(func(k string) string { return tc.env[k] }); err != nil || got != tc.want {
			t.Errorf("Path(%v) = %q %v, want %q", tc.env, got, err, tc.want)
		}
	}
	if _, err := Path(func(string) string { return "" }); err == nil {
		t.Error("no XDG_CONFIG_HOME nor HOME: want an error")
	}
}
