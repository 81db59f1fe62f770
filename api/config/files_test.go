package config

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCheckFileOffline(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(present, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name    string
		offline bool
		file    string
		wantErr bool
	}{
		{"empty is no file", false, "", false},
		{"present", false, present, false},
		{"missing", false, missing, true},
		{"a directory", false, dir, true},
		{"missing, offline", true, missing, false},
		{"a directory, offline", true, dir, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			SetOffline(tc.offline)
			defer SetOffline(false)
			if err := CheckFile(tc.file); (err != nil) != tc.wantErr {
				t.Errorf("CheckFile(%q) = %v, want error %v", tc.file, err, tc.wantErr)
			}
			if tc.file != dir { // opening a directory succeeds on Linux
				if err := CheckReadable(tc.file); (err != nil) != tc.wantErr {
					t.Errorf("CheckReadable(%q) = %v, want error %v", tc.file, err, tc.wantErr)
				}
			}
		})
	}
}
