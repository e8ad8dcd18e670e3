//go:build !goexperiment.jsonv2

package events

// JSONv2 says whether this build's encoding/json is its v2
// implementation: see jsonv2.go.
const JSONv2 = false
