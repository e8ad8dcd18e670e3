package expression

// PlainWords is plainWords, for the external tests.
var PlainWords = plainWords
