package dev.settled;

/** No answer: the connection failed or timed out (the request may or may not have been done). */
public class ConnectionFailedException extends SettledException {
    public ConnectionFailedException(String message, Throwable cause) {
        super(message, cause);
    }
}
