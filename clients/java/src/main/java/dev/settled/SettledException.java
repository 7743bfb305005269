package dev.settled;

/** Base of every exception this SDK throws. */
public class SettledException extends RuntimeException {
    public SettledException(String message) {
        super(message);
    }

    public SettledException(String message, Throwable cause) {
        super(message, cause);
    }
}
