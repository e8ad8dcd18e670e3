package interp

// Every decision the dispatcher takes in this package's tests with an
// execution's view (which every execution has then, however small) is
// taken again without it: they must agree (a panic fails the test that
// took it).
func init() { SetVerifyView(true) }
