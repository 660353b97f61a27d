// gRPC messages as JSON, with no generated code: a serializer and a deserializer for any Codable type.
import Foundation
import GRPCCore

struct JSONSerializer<Message: Encodable>: MessageSerializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: Message) throws -> Bytes {
        do {
            return Bytes(try JSONEncoder().encode(message))
        } catch {
            throw RPCError(code: .internalError, message: "cannot encode the response: \(error)")
        }
    }
}

struct JSONDeserializer<Message: Decodable>: MessageDeserializer {
    func deserialize<Bytes: GRPCContiguousBytes>(_ serializedMessageBytes: Bytes) throws -> Message {
        do {
            return try serializedMessageBytes.withUnsafeBytes { try JSONDecoder().decode(Message.self, from: Data($0)) }
        } catch {
            throw RPCError(code: .invalidArgument, message: "cannot decode the request: \(error)")
        }
    }
}
