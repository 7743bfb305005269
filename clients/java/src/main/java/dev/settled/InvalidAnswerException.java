package dev.settled;

/** A success whose body is not the JSON the operation answers: as with no answer, the request may or may not have been done. */
public class InvalidAnswerException extends ConnectionFailedException {
    private final int status;

    public InvalidAnswerException(String message, int status, Throwable cause) {
        super(message, cause);
        this.status = status;
    }

    public int status() { return status; }
}
