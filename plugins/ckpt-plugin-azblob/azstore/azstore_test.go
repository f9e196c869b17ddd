package azstore

import (
	"net/url"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cs := map[string]string{"AZURE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey=k"}
	for _, tc := range []struct {
		url  string
		env  map[string]string
		want Options
		err  string
	}{
		{url: "az://c/job/x/", env: cs, want: Options{Container: "c", Prefix: "job/x", ConnectionString: cs["AZURE_STORAGE_CONNECTION_STRING"]}},
		{url: "az://c", env: map[string]string{"AZURE_STORAGE_ACCOUNT": "acct"}, want: Options{Container: "c", Endpoint: "https://acct.blob.core.windows.net/"}},
		{url: "az://c/p?account=other", want: Options{Container: "c", Prefix: "p", Endpoint: "https://other.blob.core.windows.net/"}},
		{url: "az://c/p?endpoint=https://e.example/", want: Options{Container: "c", Prefix: "p", Endpoint: "https://e.example/"}},
		{url: "az://c/p", err: "no Azure account"},
		{url: "az:///p", env: cs, err: "no container"},
		{url: "az://u:secret@c/p", env: cs, err: "credentials do not belong"},
		{url: "az://c/p?region=x", env: cs, err: "unknown parameter"},
		{url: "az://c/p?account=a", env: cs, err: "one or the other"},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseURL(u, env(tc.env))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: err %v, want %q", tc.url, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.url, got, err, tc.want)
		}
	}
}
