package interp

// Every decision the dispatcher takes in this package's tests with an
// execution's view is taken again without it: they must agree (a panic
// fails the test that took it).
func init() { verifyView = true }
