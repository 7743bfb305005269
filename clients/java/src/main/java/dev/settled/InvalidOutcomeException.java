package dev.settled;

/** An outcome outside the spec (a missing code, a malformed railCode or retryAfterMs): thrown when it is made. */
public class InvalidOutcomeException extends SettledException {
    public InvalidOutcomeException(String message) {
        super(message);
    }
}
