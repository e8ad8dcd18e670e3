// Package spelling tells which known name a misspelt one was meant to
// be, for the "did you mean" of error messages: a workflow's field or step
// kind, an expression's name, a workflow given to the CLI.
package spelling

import (
	"slices"
	"strings"
)

// Meant is the one name of known that name was meant to be: the same
// with '-' for '_' or the other way round, or one slip of its spelling
// away (a letter inserted, deleted, replaced, or swapped with the next);
// "" if name is known, none is, two are as near, or name is too short to
// tell a slip from another word.
func Meant(name string, known []string) string {
	if slices.Contains(known, name) {
		return ""
	}
	for _, alt := range []string{strings.ReplaceAll(name, "-", "_"), strings.ReplaceAll(name, "_", "-")} {
		if alt != name && slices.Contains(known, alt) {
			return alt
		}
	}
	if len(name) < 4 {
		return ""
	}
	var near []string
	for _, k := range known {
		if editDistance(name, k) == 1 && !slices.Contains(near, k) {
			near = append(near, k)
		}
	}
	if len(near) != 1 {
		return ""
	}
	return near[0]
}

// editDistance is the number of letters inserted, deleted, replaced or
// swapped with their neighbour that turn a into b (optimal string
// alignment).
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
