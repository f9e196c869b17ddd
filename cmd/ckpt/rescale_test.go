package main

import "testing"

func TestHasFlagSeesFlagsNotValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--rescale-from", "a,b"}, true},
		{[]string{"-rescale-from=a"}, true},
		{[]string{"--task", "rescale-from"}, false},
		{[]string{"--", "--rescale-from"}, false},
		{[]string{"--rescale-fromage"}, false},
	} {
		if got := hasFlag(tc.args, "rescale-from"); got != tc.want {
			t.Errorf("hasFlag(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
