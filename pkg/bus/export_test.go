package bus

// ClosedWhileMade is closedWhileMade, for the external tests.
var ClosedWhileMade = closedWhileMade

// RetryLayout is retryLayout, for the external tests.
var RetryLayout = retryLayout
